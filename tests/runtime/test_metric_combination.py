"""relax.runtime.metrics.actor_metrics.combine_actor_metrics: shares summed over data-parallel ranks per
optimizer step, replicated metrics taken once, then the mean over the optimizer steps."""

from __future__ import annotations

import pytest

from relax.runtime.metrics.actor_metrics import combine_actor_metrics


def test_shares_are_summed_over_ranks_and_averaged_over_steps():
    # Two ranks, two optimizer steps. Step 1: pg_loss 0.25 + 0.5 = 0.75; step 2: -0.125 + 0.375 = 0.25.
    rank0 = [{"loss": 0.25, "pg_loss": 0.25, "grad_norm": 2.0, "lr": 1e-3},
             {"loss": -0.125, "pg_loss": -0.125, "grad_norm": 4.0, "lr": 1e-3}]
    rank1 = [{"loss": 0.5, "pg_loss": 0.5, "grad_norm": 2.0, "lr": 1e-3},
             {"loss": 0.375, "pg_loss": 0.375, "grad_norm": 4.0, "lr": 1e-3}]
    got = combine_actor_metrics([rank0, rank1])
    assert got == {
        "loss": pytest.approx((0.75 + 0.25) / 2),
        "pg_loss": pytest.approx((0.75 + 0.25) / 2),
        "grad_norm": pytest.approx(3.0),  # the same on every rank: not multiplied by the rank count
        "lr": pytest.approx(1e-3),
    }


def test_a_rank_without_data_for_a_step_contributes_zero():
    # Rank 1 held nothing of step 1 (zero loss, no loss metrics): step 1's clip fraction is rank 0's
    # alone, and it still counts as a step in the mean.
    rank0 = [{"loss": 0.4, "pg_clipfrac": 0.3, "grad_norm": 1.0}, {"loss": 0.1, "pg_clipfrac": 0.05, "grad_norm": 3.0}]
    rank1 = [{"loss": 0.0, "grad_norm": 1.0}, {"loss": 0.2, "pg_clipfrac": 0.15, "grad_norm": 3.0}]
    got = combine_actor_metrics([rank0, rank1])
    assert got["pg_clipfrac"] == pytest.approx((0.3 + 0.2) / 2)
    assert got["loss"] == pytest.approx((0.4 + 0.3) / 2)
    assert got["grad_norm"] == pytest.approx(2.0)


def test_one_rank_is_the_mean_over_steps():
    steps = [{"loss": 1.0, "entropy": 2.0}, {"loss": 3.0, "entropy": 1.0}, {"loss": 2.0, "entropy": 0.0}]
    assert combine_actor_metrics([steps]) == {"loss": pytest.approx(2.0), "entropy": pytest.approx(1.0)}


def test_a_metric_reported_in_some_steps_only_is_averaged_over_those():
    got = combine_actor_metrics([[{"loss": 1.0, "kl_loss": 0.5}, {"loss": 3.0}]])
    assert got == {"loss": pytest.approx(2.0), "kl_loss": pytest.approx(0.5)}


def test_no_ranks_gives_no_metrics():
    assert combine_actor_metrics([]) == {}


def test_ranks_with_different_step_counts_are_refused():
    with pytest.raises(ValueError, match=r"same optimizer steps.*\[2, 1\]"):
        combine_actor_metrics([[{"loss": 1.0}, {"loss": 2.0}], [{"loss": 1.0}]])
