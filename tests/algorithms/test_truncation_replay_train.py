"""Importance weights under truncated sampling, length-safe sequence weights and the ``abs`` KL through
``relax train`` (``--in-process``: the same step, no Ray cluster; a few seconds per run).

At step 1 nothing has been trained yet, so the trainer's policy is the one that sampled: with the
sampling's kept set replayed (the default) every importance weight is 1 and the engine's and trainer's
log-probs agree; with ``--full-vocabulary-log-probs`` each token's weight is its kept probability mass.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from relax.algorithms import AlgorithmConfig
from relax.cli.main import main
from relax.config.run import RunConfig
from relax.runtime.driver.train import run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from run_results import training_rows  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

COMMON = dict(rollout_top_p=0.7, rollout_batch_size=4, num_steps_per_rollout=1, seed=3, in_process=True,
              progress=False)
WEIGHT_METRICS = ("off_policy/weight_p50", "off_policy/weight_p99", "off_policy/weight_max")


def _run(tmp_path, name, steps=1, **algorithm):
    run(RunConfig(advantage_estimator="grpo", algorithm=AlgorithmConfig(n_samples_per_prompt=4, **algorithm),
                  num_rollout=steps, output_dir=str(tmp_path / name), **COMMON))
    return training_rows(tmp_path / name)


def test_on_policy_weights_are_one_under_top_p_from_the_command_line(tmp_path):
    out = tmp_path / "cli"
    code = main(["train", "--rollout-top-p", "0.7", "--off-policy-correction", "tis", "--in-process",
                 "--num-rollout", "1", "--rollout-batch-size", "4", "--n-samples-per-prompt", "4",
                 "--num-steps-per-rollout", "1", "--seed", "3", "--no-progress", "--output-dir", str(out)])
    assert code in (0, None)
    first = training_rows(out)[0]
    assert first["actor/off_policy_weight"] == pytest.approx(1.0, abs=1e-3)
    assert first["rollout/logprob_abs_diff"] < 1e-4
    for name in WEIGHT_METRICS:
        assert first[name] == pytest.approx(1.0, abs=1e-3)
    assert first["off_policy/weight_ess"] == pytest.approx(1.0, abs=1e-6)
    assert first["off_policy/capped_share"] == 0.0


@pytest.mark.parametrize("sampling", [dict(rollout_top_k=5), dict(rollout_min_p=0.1)], ids=["top_k", "min_p"])
def test_on_policy_weights_are_one_under_top_k_and_min_p(tmp_path, sampling):
    def first(name, **algorithm):
        run(RunConfig(advantage_estimator="grpo", num_rollout=1, output_dir=str(tmp_path / name),
                      algorithm=AlgorithmConfig(n_samples_per_prompt=4, off_policy_correction="tis", **algorithm),
                      **{**COMMON, "rollout_top_p": 1.0, **sampling}))
        return training_rows(tmp_path / name)[0]

    replayed, full = first("replayed"), first("full", full_vocabulary_log_probs=True)
    assert replayed["actor/off_policy_weight"] == pytest.approx(1.0, abs=1e-3)
    assert replayed["rollout/logprob_abs_diff"] < 1e-4
    assert replayed["off_policy/weight_max"] == pytest.approx(1.0, abs=1e-3)
    # the same samples scored on the whole vocabulary: the truncation was real
    assert full["actor/off_policy_weight"] < 0.99 and full["rollout/logprob_abs_diff"] > 1e-2


def test_full_vocabulary_scores_give_each_token_its_kept_mass(tmp_path):
    first = _run(tmp_path, "full", off_policy_correction="tis", full_vocabulary_log_probs=True)[0]
    # every token weighs its kept mass (< 1): the whole loss is scaled down by the sampling settings
    assert 0.5 < first["actor/off_policy_weight"] < 0.9
    assert first["rollout/logprob_abs_diff"] > 0.1
    assert first["off_policy/weight_max"] <= 1.0 + 1e-6
    assert first["off_policy/weight_p50"] < 0.9


def test_the_geometric_mean_keeps_long_sequences_that_the_product_silences(tmp_path):
    # full-vocabulary scores make every token weigh its kept mass w_t < 1 at step 1: the product over a
    # sequence shrinks with its length, the geometric mean stays within the token weights' range
    product = _run(tmp_path, "seq_tis", off_policy_correction="seq_tis", full_vocabulary_log_probs=True)[0]
    geo = _run(tmp_path, "seq_geo_tis", off_policy_correction="seq_geo_tis", full_vocabulary_log_probs=True)[0]
    assert product["off_policy/weight_p50"] < geo["off_policy/weight_p50"] < 1.0
    assert geo["off_policy/weight_max"] <= 1.0 + 1e-6
    assert geo["actor/off_policy_weight"] > product["actor/off_policy_weight"]
    # the geometric mean of token weights is no smaller than their smallest, which tis's mean bounds
    assert geo["off_policy/weight_p50"] > 0.5


def test_abs_kl_reports_the_mean_absolute_log_ratio_and_the_reference_is_replayed_too(tmp_path):
    # a tiny KL coefficient: the reference model runs, the term hardly moves the policy, so the two
    # runs train (almost) the same weights and their step-2 KL estimates compare on the same tokens
    kl = dict(use_kl_loss=True, kl_loss_coef=1e-9, off_policy_correction="tis")
    absolute = _run(tmp_path, "abs", steps=2, kl_loss_type="abs", **kl)
    signed = _run(tmp_path, "k1", steps=2, kl_loss_type="k1", **kl)
    # step 1: policy == reference, both scored on the replayed kept set: no KL at all
    assert absolute[0]["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)
    assert absolute[0]["actor/kl_to_ref"] == pytest.approx(0.0, abs=1e-6)
    # step 2: mean |d| >= |mean d|, strictly when the log-ratio changes sign across tokens
    assert absolute[1]["actor/kl_to_ref"] > abs(signed[1]["actor/kl_to_ref"]) + 1e-6
    assert absolute[1]["actor/kl_loss"] == pytest.approx(absolute[1]["actor/kl_to_ref"], rel=1e-4)
