"""``--loss-aggregation seq_mean_token_sum_norm`` and ``--kl-loss-type k3+`` through ``relax train``
(``relax.runtime.driver.train.run``, two steps on the embedded default): each option's effect on what a run
logs and trains."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from relax.algorithms import AlgorithmConfig
from relax.config.run import RunConfig
from relax.runtime.driver.train import run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from run_results import checkpoint_weights, training_rows  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(600)]

MAX_LEN = 6  # --rollout-max-response-len: the L_max of seq_mean_token_sum_norm
KL = dict(use_kl_loss=True, kl_loss_coef=1.0)  # a strong KL term, so that its gradient matters


@pytest.fixture(scope="module")
def runs(ray_cluster, tmp_path_factory):
    """Three 2-step runs from the same seed: the baseline (seq_mean_token_sum, k3), then one option
    changed in each of the others."""
    base = tmp_path_factory.mktemp("loss_variants")
    variants = {
        "base": dict(loss_aggregation="seq_mean_token_sum", kl_loss_type="k3"),
        "norm": dict(loss_aggregation="seq_mean_token_sum_norm", kl_loss_type="k3"),
        "k3plus": dict(loss_aggregation="seq_mean_token_sum", kl_loss_type="k3+"),
    }
    out = {}
    for name, algorithm in variants.items():
        run(RunConfig(advantage_estimator="grpo",
                      algorithm=AlgorithmConfig(n_samples_per_prompt=4, **KL, **algorithm),
                      rollout_batch_size=4, num_steps_per_rollout=1, num_rollout=2,
                      rollout_max_response_len=MAX_LEN, lr=1e-2, save_interval=2, seed=3,
                      output_dir=str(base / name), progress=False))
        out[name] = (training_rows(base / name), checkpoint_weights(base / name, 2))
    return out


def test_seq_mean_token_sum_norm_divides_the_token_sum_by_the_generation_limit(runs):
    # step 1 samples the same rollout from the same weights (the policy is the reference, so the KL
    # term is 0): the loss and its gradient are seq_mean_token_sum's divided by the constant
    # L_max = --rollout-max-response-len
    a, b = runs["base"][0][0], runs["norm"][0][0]
    assert a["actor/pg_loss"] != 0.0
    assert b["actor/pg_loss"] == pytest.approx(a["actor/pg_loss"] / MAX_LEN, rel=1e-5)
    assert b["actor/grad_norm"] == pytest.approx(a["actor/grad_norm"] / MAX_LEN, rel=1e-4)


def test_k3_plus_logs_k3s_value_but_trains_with_k2s_gradient(runs):
    (k3_rows, k3_weights), (plus_rows, plus_weights) = runs["base"], runs["k3plus"]
    # step 1: the policy is the reference (d = 0, both gradients 0); step 2 starts from the same
    # weights, so the logged KL (k3's value for both) agrees
    assert plus_rows[0]["actor/grad_norm"] == pytest.approx(k3_rows[0]["actor/grad_norm"], rel=1e-6)
    assert plus_rows[1]["actor/kl_loss"] > 0
    assert plus_rows[1]["actor/kl_loss"] == pytest.approx(k3_rows[1]["actor/kl_loss"], rel=1e-4)
    # ... but the KL term's gradient differs (d instead of 1 - e^-d), and so do the trained weights
    assert plus_rows[1]["actor/grad_norm"] != k3_rows[1]["actor/grad_norm"]
    assert any(not torch.equal(k3_weights[k], plus_weights[k]) for k in k3_weights)
