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
