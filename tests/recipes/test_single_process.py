"""The single-process recipe is ``relax train --in-process`` called from Python: bit-identical metrics
(timings aside) and weights to a Ray run over 5 synchronous steps with one rollout worker and one actor
rank, the run's own rows and final weights handed back, and what needs Ray refused before it starts."""

from __future__ import annotations

import json

import attrs
import pytest
import torch

from relax.config.algorithm import AlgorithmConfig
from relax.config.run import RunConfig
from relax.recipes.single_process import train_single_process
from relax.rollout.tasks import get_task
from relax.runtime.driver.train import run
from relax.runtime.files.checkpoint_files import checkpoint_path

STEPS = 5
TIMED_PREFIXES = ("time/", "perf/")  # wall-time measurements
TIMED_KEYS = {"rollout/tokens_per_s"}


def _config(algo: str, out, **kw) -> RunConfig:
    return RunConfig(
        advantage_estimator=algo,
        algorithm=AlgorithmConfig(reward_keys=get_task("addition").reward_keys, n_samples_per_prompt=4),
        rollout_batch_size=6, num_steps_per_rollout=2, num_rollout=STEPS, seed=5, evaluate=False,
        progress=False, output_dir=str(out), **kw,
    )


def _untimed(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith(TIMED_PREFIXES) and k not in TIMED_KEYS}


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.parametrize(("algo", "extra"), [("grpo", {}), ("gdpo", {}), ("gdpo", {"advantages_on_actor": True})])
def test_single_process_recipe_equals_relax_train_bit_for_bit(ray_cluster, tmp_path, algo, extra):
    config = _config(algo, tmp_path / "ray", **extra)
    run(config)
    ray_rows = [json.loads(line) for line in (tmp_path / "ray" / "metrics.jsonl").read_text().splitlines()]
    ray_weights = torch.load(checkpoint_path(tmp_path / "ray", STEPS), weights_only=False)["actor"]["backend"]["model"]

    local = train_single_process(attrs.evolve(config, output_dir=str(tmp_path / "local")))

    assert [r["step"] for r in ray_rows] == list(range(1, STEPS + 1))
    assert [_untimed(r) for r in local.rows] == [_untimed(r) for r in ray_rows]  # every metric, exactly
    assert any(r.get("actor/grad_norm", 0.0) > 0 for r in local.rows)  # the steps really trained
    assert local.weights.keys() == ray_weights.keys()
    for name, value in ray_weights.items():
        assert torch.equal(local.weights[name], value), name


@pytest.mark.timeout(300)
def test_single_process_hands_back_the_runs_rows_and_final_weights(tmp_path):
    from relax.models.tiny.weights import load_warmup_model

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        result = train_single_process(attrs.evolve(_config("grpo", tmp_path), num_rollout=2))
        assert torch.get_num_threads() == 2  # run() trains with one thread; the caller's setting comes back
    finally:
        torch.set_num_threads(threads)
    assert result.rows == [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in result.rows] == [1, 2]
    assert {"reward/correct/mean", "rollout/groups_kept", "time/step_s"} <= set(result.rows[-1])  # relax train's names
    assert result.summary.steps_run == 2 and result.summary.checkpoint == str(checkpoint_path(tmp_path, 2))
    initial = load_warmup_model().state_dict()
    assert result.weights.keys() == initial.keys()
    assert any(not torch.equal(result.weights[k], initial[k]) for k in initial)  # the two steps trained


def test_single_process_refuses_what_only_the_runtime_runs(tmp_path):
    with pytest.raises(ValueError, match="--rollout-num-workers 2"):
        train_single_process(_config("grpo", tmp_path, rollout_num_workers=2))
    with pytest.raises(ValueError, match="--fully-async"):
        train_single_process(_config("grpo", tmp_path, fully_async=True))
