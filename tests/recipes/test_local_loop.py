"""relax.recipes.local_loop: determinism, validation, diagnostics, and the bare_loop wrapper."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from relax.rollout.tasks import get_task
from relax.recipes.local_loop import TIMING_PREFIX, recipe_config, train_local

REPO = Path(__file__).resolve().parents[2]
STEPS = 5


def _untimed(history):
    return [{k: v for k, v in row.items() if not k.startswith(TIMING_PREFIX)} for row in history]


def _run(algorithm="gdpo", task="addition-brevity", weights=(1, 1, 1, 1, 10), seed=0, **kw):
    t = get_task(task)
    return train_local(t, algorithm, recipe_config(t.reward_keys, weights), steps=STEPS, seed=seed, **kw)


@pytest.mark.timeout(300)
def test_same_seed_gives_identical_metrics_and_a_different_seed_does_not():
    threads = torch.get_num_threads()
    a, b, c = _run(seed=3), _run(seed=3), _run(seed=4)
    assert torch.get_num_threads() == threads  # the loop restores the caller's setting
    assert len(a.history) == STEPS
    assert _untimed(a.history) == _untimed(b.history)  # exact equality, every metric of every step
    assert a.greedy_accuracy == b.greedy_accuracy
    assert _untimed(a.history) != _untimed(c.history)


@pytest.mark.timeout(300)
def test_every_step_logs_components_diagnostics_and_training():
    result = _run(algorithm="grpo")
    for row in result.history:
        for key in get_task("addition-brevity").reward_keys:
            assert 0.0 <= row[f"reward/{key}/mean"] <= 1.0
        assert {"multi_reward/collapse_rate", "multi_reward/gdpo_cancel_rate", "advantage/zero_frac"} <= set(
            row
        )
        assert 1.0 <= row["response/tokens_mean"] <= 8.0
        if row["kept_frac"] > 0:
            assert "train/loss" in row and "train/grad_norm" in row
        # dropped groups enter the diagnostics with advantage exactly 0
        assert row["advantage/zero_frac"] >= 1.0 - row["kept_frac"] - 1e-12
    assert 0.0 <= result.greedy_accuracy <= 1.0
    assert result.reward_weights == (1.0, 1.0, 1.0, 1.0, 10.0)


def test_bad_arguments_name_what_to_fix():
    task = get_task("addition")
    with pytest.raises(ValueError, match="not components of task 'addition'"):
        train_local(task, "grpo", recipe_config(("correct", "judge")), steps=1)
    with pytest.raises(ValueError, match="n_samples_per_prompt=4 but n_samples=8"):
        train_local(task, "grpo", recipe_config(task.reward_keys, n_samples_per_prompt=4), steps=1)
    with pytest.raises(ValueError, match="pass its AlgorithmConfig"):
        train_local(task, "grpo", None, steps=1)
    with pytest.raises(ValueError, match="steps must be >= 1"):
        train_local(task, "grpo", recipe_config(task.reward_keys), steps=0)


@pytest.mark.timeout(300)
def test_bare_loop_wrapper_is_the_local_loop():
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        from bare_loop import make_algorithm, run_bare_loop
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    keys = get_task("addition").reward_keys
    out = run_bare_loop(make_algorithm("grpo", keys), steps=3, seed=1, log_every=0)
    direct = train_local(
        "addition", "grpo", recipe_config(keys), steps=3, seed=1, diagnostics=False, num_threads=None
    )
    assert _untimed(out["history"]) == _untimed(direct.history)
    assert out["summary"]["greedy_accuracy_100"] == direct.greedy_accuracy
    assert out["summary"]["steps"] == 3 and {"time/step_s", "time/rollout_s"} <= set(out["history"][0])


@pytest.mark.timeout(300)
def test_reward_scales_multiply_the_raw_component_before_the_algorithm():
    # For GRPO a component reported x10 is the same as weight 10 (it sums raw rewards): identical runs.
    task = get_task("addition-brevity")
    scaled = train_local(
        task,
        "grpo",
        recipe_config(task.reward_keys),
        steps=3,
        seed=2,
        reward_scales={"brevity": 10},
        evaluate=False,
    )
    weighted = train_local(
        task, "grpo", recipe_config(task.reward_keys, (1, 1, 1, 1, 10)), steps=3, seed=2, evaluate=False
    )
    for a, b in zip(scaled.history, weighted.history):
        assert {k: v for k, v in a.items() if k.startswith(("reward/", "train/", "kept"))} == {
            k: v for k, v in b.items() if k.startswith(("reward/", "train/", "kept"))
        }
        assert 0.0 <= a["reward/brevity/mean"] <= 1.0  # logged in the task's units
    with pytest.raises(ValueError, match=r"reward_scales\['brevity'\] must be a finite number > 0"):
        train_local(task, "grpo", recipe_config(task.reward_keys), steps=1, reward_scales={"brevity": 0})
    with pytest.raises(ValueError, match="reward_scales names 'judge'"):
        train_local(task, "grpo", recipe_config(task.reward_keys), steps=1, reward_scales={"judge": 2})
