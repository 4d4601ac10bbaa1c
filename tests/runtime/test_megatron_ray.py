"""``relax train --backend megatron`` through the real Ray + Serve + TransferQueue path, on the
session's shared cluster (these run in the tox environment with megatron-core: ``-m megatron``).

The configurations come from real command lines (``relax train ...`` parsed and validated by the
CLI), so the defaults are the ones a user gets.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch

from relax.runtime.driver.train import run
from relax.runtime.files.checkpoint_files import checkpoint_path

pytestmark = [
    pytest.mark.megatron,
    pytest.mark.ray,
    pytest.mark.filterwarnings("ignore"),
    pytest.mark.skipif(importlib.util.find_spec("megatron.core") is None, reason="megatron-core is not installed"),
]

KEYS = ("correct", "digits", "format", "length")
STEPS = 10  # the embedded default's format/length components rise by ~0.2 within 6 steps
COMPARED = 3  # steps of the TP=2 vs TP=1 comparison


def _config(out, *flags):
    from relax.cli.main import build_parser, prepare_train_config

    parser, subparsers = build_parser()
    argv = ["train", "--advantage-estimator", "gdpo", "--backend", "megatron", "--seed", "3",
            "--output-dir", str(out), "--no-progress", *map(str, flags)]
    return prepare_train_config(argv, parser, subparsers["train"])[0]


def _rows(out) -> list[dict]:
    """The training steps' rows (step 0 is the embedded default's evaluation before training)."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if row["step"] > 0]


def _state(out, step) -> dict:
    return torch.load(checkpoint_path(out, step), weights_only=False)


@pytest.fixture(scope="module")
def tp1(ray_cluster, tmp_path_factory):
    out = tmp_path_factory.mktemp("megatron_tp1")
    summary = run(_config(out, "--num-rollout", STEPS, "--save-interval", COMPARED))
    return out, summary


@pytest.mark.timeout(300)
def test_megatron_gdpo_raises_the_reward(tp1):
    out, summary = tp1
    rows = _rows(out)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1)) and summary.steps_run == STEPS
    assert all("actor/loss" in r and "actor/grad_norm" in r for r in rows)

    def total(part):  # equal-weight sum of the component means, averaged over the steps
        return sum(r[f"reward/{k}/mean"] for r in part for k in KEYS) / len(part)

    first, last = total(rows[:3]), total(rows[-3:])
    assert last > first + 0.1, (first, last)
    # A Megatron checkpoint holds the whole model in TinyCausalLM naming (what the rollout loads).
    from relax.models.tiny.weights import load_warmup_model

    state = _state(out, STEPS)
    assert state["backend"] == "megatron"
    initial = load_warmup_model().state_dict()
    model = state["actor"]["backend"]["model"]
    assert set(model) == set(initial) and all(model[k].shape == initial[k].shape for k in initial)


@pytest.mark.timeout(300)
def test_tensor_parallel_2_follows_the_tp1_trajectory(tp1, tmp_path):
    full, _ = tp1
    out = tmp_path / "tp2"
    run(_config(out, "--num-rollout", COMPARED, "--save-interval", COMPARED,
                "--tensor-model-parallel-size", 2, "--actor-num-workers", 2))
    rows, ref = _rows(out), _rows(full)[:COMPARED]
    assert [r["step"] for r in rows] == list(range(1, COMPARED + 1))
    for a, b in zip(rows, ref):
        for key in KEYS:  # same weights up to float noise -> the same samples and rewards
            assert a[f"reward/{key}/mean"] == pytest.approx(b[f"reward/{key}/mean"], abs=1e-12), (a["step"], key)
        for key in ("actor/loss", "actor/grad_norm", "actor/pg_clipfrac"):
            if key in b:
                assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), (a["step"], key)
    # The TP=2 checkpoint is gathered over both ranks into the same layout-free state. The key
    # bias is left out: it adds the same q.b_k to every score of a query, so its exact gradient is
    # zero and its measured one (~1e-10) is rounding noise, which Adam scales up to lr-sized steps
    # that differ between layouts (measured: every other tensor agrees to ~1e-6 relative).
    w2, w1 = _state(out, COMPARED)["actor"]["backend"], _state(full, COMPARED)["actor"]["backend"]
    for part in ("model", "exp_avg", "exp_avg_sq"):
        assert w2[part].keys() == w1[part].keys()
        for name, value in w1[part].items():
            if not name.endswith("attn.k_proj.bias"):
                scale = float(value.abs().max())
                assert torch.allclose(w2[part][name], value, rtol=1e-4, atol=1e-5 * scale), (part, name)
