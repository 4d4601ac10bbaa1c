"""``--max-tokens-per-micro-batch`` through ``relax.runtime.driver.train.run``: the actor's optimizer steps run
on packed micro-batches (the metrics count them and the tokens computed), and one rollout with a KL
loss (the reference model's pass packed too) trains to the padded run's losses, KL and gradient
norms, to float rounding."""

from __future__ import annotations

import pytest
from run_results import training_rows

from relax.algorithms import AlgorithmConfig
from relax.config.run import RunConfig
from relax.runtime.driver.train import run

KEYS = ("correct", "digits", "format", "length")


def _config(out, **kw) -> RunConfig:
    return RunConfig(advantage_estimator="grpo", algorithm=AlgorithmConfig(reward_keys=KEYS, n_samples_per_prompt=4,
                                                                        use_kl_loss=True, kl_loss_coef=0.5),
                     rollout_batch_size=4, num_steps_per_rollout=2, num_rollout=1, seed=5, output_dir=str(out),
                     progress=False, **kw)


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_packed_run_counts_its_micro_batches_and_matches_the_padded_run(ray_cluster, tmp_path):
    run(_config(tmp_path / "padded", micro_batch_size=4))
    run(_config(tmp_path / "packed", max_tokens_per_micro_batch=24))
    (padded,), (packed,) = training_rows(tmp_path / "padded"), training_rows(tmp_path / "packed")
    assert "actor/micro_batches" not in padded
    # 8 samples per optimizer step, each at most 16 tokens (the built-in model's context): the
    # micro-batches hold at most 24 tokens each, and there are fewer than samples
    tokens, micro = packed["actor/packed_tokens"], packed["actor/micro_batches"]
    assert tokens / 24 <= micro < 8
    assert tokens < packed["actor/padded_tokens"]  # the padding is not computed
    assert {"actor/loss", "actor/pg_loss", "actor/grad_norm", "actor/kl_loss"} <= set(padded)
    assert padded["actor/kl_loss"] > 0  # the second optimizer step's policy has left the reference
    for key in ("actor/loss", "actor/pg_loss", "actor/entropy", "actor/grad_norm", "actor/ppo_kl", "actor/kl_loss"):
        if key in padded:
            assert packed[key] == pytest.approx(padded[key], rel=1e-4, abs=1e-6), key
    # the same samples (the rollout ran on the same weights); the engine-vs-trainer log-prob gap to rounding
    rollout = [k for k in padded if k.startswith("rollout/") and not k.endswith("_per_s")]
    assert rollout and all(packed[k] == pytest.approx(padded[k], rel=1e-4, abs=1e-6) for k in rollout)
