"""Combine the actor ranks' per-optimizer-step metrics into the values logged for one rollout step.

The loss and the loss metrics of one optimizer step are *shares* of the mini-batch
(``relax.algorithms.types.PolicyLossOutput``): each data-parallel rank holds its part, normalized by
the mini-batch's global counts, so the whole mini-batch value is the sum over ranks. ``grad_norm``
and ``lr`` are different: the gradients are all-reduced before the norm is taken, so every rank
reports the same number, and summing would multiply it by the number of ranks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

# Metrics every rank reports identically (taken from one rank, never summed).
REPLICATED_METRICS = frozenset({"grad_norm", "lr"})

# Shares logged outside ``actor/``: measured on the training ranks, they describe the rollout.
LOGGED_NAMES = {"logprob_abs_diff": "rollout/logprob_abs_diff"}

# Where ``ActorCore.train`` hands its per-step metrics to the driver (popped before logging).
STEP_METRICS_KEY = "_actor_step_metrics"


def logged_name(key: str) -> str:
    """The metrics-row name of a combined actor metric: ``actor/<key>`` unless ``LOGGED_NAMES`` says otherwise."""
    return LOGGED_NAMES.get(key, f"actor/{key}")


def combine_actor_metrics(
    rank_steps: Sequence[Sequence[Mapping[str, float]]],
    replicated: frozenset[str] = REPLICATED_METRICS,
) -> dict[str, float]:
    """``rank_steps[r][j]``: the backend metrics of optimizer step ``j`` on data-parallel rank ``r``
    (one entry per data-parallel rank: tensor/pipeline peers of a rank hold the same numbers and
    must not be listed twice). Returns, per metric, the mean over optimizer steps of the per-step
    value, where a step's value is the sum over ranks for a share and the first reporting rank's
    value for a ``replicated`` metric.

    A rank that held nothing of a mini-batch reports no share for it, which counts as 0. A metric
    is averaged over the steps in which at least one rank reported it.
    """
    if not rank_steps:
        return {}
    num_steps = {len(steps) for steps in rank_steps}
    if len(num_steps) != 1:
        raise ValueError(
            f"every data-parallel rank must run the same optimizer steps, got step counts "
            f"{[len(steps) for steps in rank_steps]} on ranks 0..{len(rank_steps) - 1}"
        )
    per_step: list[dict[str, float]] = []
    for j in range(num_steps.pop()):
        step: dict[str, float] = {}
        for steps in rank_steps:
            for name, value in steps[j].items():
                if name in replicated:
                    step.setdefault(name, float(value))
                else:
                    step[name] = step.get(name, 0.0) + float(value)
        per_step.append(step)
    names = sorted({name for step in per_step for name in step})
    return {
        name: sum(step[name] for step in per_step if name in step) / sum(1 for step in per_step if name in step)
        for name in names
    }
