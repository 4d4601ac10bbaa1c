"""The single-process recipe and ``relax train`` are one step definition: bit-identical metrics
(timings aside) and weights over 5 synchronous steps with one rollout worker and one actor rank."""

from __future__ import annotations

import json

import pytest
import torch

from relax.config.algorithm import AlgorithmConfig
from relax.config.run import RunConfig
from relax.recipes.single_process import train_single_process
from relax.rollout.tasks import get_task
from relax.runtime.checkpoints import checkpoint_path
from relax.runtime.train import run

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

    local = train_single_process(config)

    assert [r["step"] for r in ray_rows] == list(range(1, STEPS + 1))
    assert [_untimed(r) for r in local.rows] == [_untimed(r) for r in ray_rows]  # every metric, exactly
    assert any(r.get("actor/grad_norm", 0.0) > 0 for r in local.rows)  # the steps really trained
    assert local.weights.keys() == ray_weights.keys()
    for name, value in ray_weights.items():
        assert torch.equal(local.weights[name], value), name


def test_single_process_refuses_what_only_the_runtime_runs(tmp_path):
    with pytest.raises(ValueError, match="--rollout-num-workers 2"):
        train_single_process(_config("grpo", tmp_path, rollout_num_workers=2))
    with pytest.raises(ValueError, match="--fully-async"):
        train_single_process(_config("grpo", tmp_path, fully_async=True))
