"""Reading a finished run's results in the end-to-end tests: its metrics rows and checkpointed weights."""

from __future__ import annotations

import json

import torch

from relax.runtime.files.checkpoint_files import checkpoint_path


def metrics_rows(out) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def training_rows(out) -> list[dict]:
    """The rows of the training steps: every row but the evaluation before training (step 0), which
    the embedded default logs (relax.runtime.driver.evaluation)."""
    return [row for row in metrics_rows(out) if row["step"] > 0]


def checkpoint_weights(out, step) -> dict:
    return torch.load(checkpoint_path(out, step), weights_only=False)["actor"]["backend"]["model"]


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k, value in a.items():
        assert torch.equal(value, b[k]), f"weights differ at {k}"


def gradient_free(name: str) -> bool:
    """Whether the built-in model's parameter ``name`` has no gradient in exact arithmetic: an attention
    key bias (softmax does not change when every key moves by the same vector). Its float32 gradient is
    rounding noise, which differs with the summation order (one rank or two, torch or Megatron) and
    which Adam scales up to steps of about lr either way: two correct runs may differ there by up to
    2 x lr per optimizer step, and are compared by that bound."""
    return name.endswith("attn.k_proj.bias")
