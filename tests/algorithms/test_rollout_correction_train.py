"""``--off-policy-correction seq_mask_tis`` and the mismatch diagnostics through ``relax train``
(``relax.runtime.driver.train.run``): fully asynchronous, one step of staleness, so from step 2 on the
samples come from the policy one update behind the trainer."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from relax.algorithms import AlgorithmConfig
from relax.config.run import RunConfig
from relax.runtime.driver.train import run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from run_results import training_rows  # noqa: E402

KEYS = ("correct", "digits", "format", "length")


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_stale_sequences_are_rejected_and_the_mismatch_is_measured(ray_cluster, tmp_path):
    # band [1/1.001, 1.001]: a sequence whose geometric-mean weight moved by more than 0.1% is rejected
    run(RunConfig(advantage_estimator="grpo",
                  algorithm=AlgorithmConfig(n_samples_per_prompt=4, reward_keys=KEYS,
                                            off_policy_correction="seq_mask_tis", off_policy_cap=1.001),
                  fully_async=True, max_staleness=1, rollout_batch_size=4, num_steps_per_rollout=1, num_rollout=3,
                  lr=1e-2, seed=3, output_dir=str(tmp_path), progress=False))
    rows = training_rows(tmp_path)
    assert [r["async/staleness_max"] for r in rows] == [0, 1, 1]
    first, stale = rows[0], rows[1:]
    # step 1 is on-policy: no mismatch, nothing rejected, every token weighs 1
    assert first["actor/off_policy_mismatch_kl"] == pytest.approx(0.0, abs=1e-9)
    assert first["actor/off_policy_mismatch_ppl_ratio"] == pytest.approx(1.0, abs=1e-6)
    assert first["actor/off_policy_capped_frac"] == 0.0
    assert first["actor/off_policy_weight"] == pytest.approx(1.0, abs=1e-5)
    # the step's weight diagnostics (off_policy/*, over the sequences' geometric means): all 1, none beyond
    assert first["off_policy/weight_max"] == pytest.approx(1.0, abs=1e-5)
    assert first["off_policy/weight_ess"] == pytest.approx(1.0, abs=1e-9)
    assert first["off_policy/capped_share"] == 0.0
    # one update behind at lr 1e-2: a measurable mismatch, and the band rejects sequences
    for r in stale:
        assert r["actor/off_policy_mismatch_kl"] > 1e-6
        assert r["actor/off_policy_mismatch_ppl_ratio"] != pytest.approx(1.0, abs=1e-6)
        assert r["actor/off_policy_capped_frac"] > 0.0
        assert r["actor/off_policy_weight"] < 1.0  # rejected sequences weigh 0
        assert r["off_policy/capped_share"] > 0.0  # sequences outside the band [1/1.001, 1.001]
        assert r["off_policy/weight_ess"] < 1.0
