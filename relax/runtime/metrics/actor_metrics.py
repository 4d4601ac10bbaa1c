"""The actor ranks' metrics: each rank's shares of a mini-batch's health metrics (``policy_health_shares``),
and their combination into the values logged for one rollout step (``combine_actor_metrics``).

The loss and the loss metrics of one optimizer step are *shares* of the mini-batch
(``relax.algorithms.types.PolicyLossOutput``): each data-parallel rank holds its part, normalized by
the mini-batch's global counts, so the whole mini-batch value is the sum over ranks. ``grad_norm``
and ``lr`` are different: the gradients are all-reduced before the norm is taken, so every rank
reports the same number, and summing would multiply it by the number of ranks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from relax.algorithms import numerics

# Metrics every rank reports identically (taken from one rank, never summed).
REPLICATED_METRICS = frozenset({"grad_norm", "lr"})

# Shares logged outside ``actor/``: measured on the training ranks, they describe the rollout.
LOGGED_NAMES = {"logprob_abs_diff": "rollout/logprob_abs_diff", "teacher_reverse_kl": "distill/reverse_kl"}

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


def policy_health_shares(shard: dict, rows: slice, response_mask: torch.Tensor, global_tokens: float,
                         kl_type: str) -> dict[str, float]:
    """This rank's shares of one mini-batch's health metrics, measured on the policy *before* the
    step's update (the old log-probs pass), whatever the loss uses: ``policy_entropy``, the token
    mean of the policy's entropy over the response tokens, and, with a reference model,
    ``kl_to_ref``, the token mean of the per-token KL estimate (``--kl-loss-type``) to it, and, where
    the samples carry the engine's log-probs, ``logprob_abs_diff``, the token mean of |engine - old|
    log-prob (logged as ``rollout/logprob_abs_diff``: the rollout/training mismatch), and, with a
    teacher, ``teacher_reverse_kl``, the token mean of log pi_old - log pi_teacher over the sampled
    tokens, the sampled estimate of the reverse KL(student || teacher) (logged as
    ``distill/reverse_kl``). Shares are
    sums over this rank's tokens divided by the mini-batch's global token count, so the driver's sum
    over data-parallel ranks is the whole mini-batch's mean (``combine_actor_metrics``)."""
    mask = response_mask.float()
    shares = {"policy_entropy": float((shard["old_entropy"][rows].float() * mask).sum()) / global_tokens}
    if "ref_log_probs" in shard:
        kl = numerics.kl_estimate(shard["old_log_probs"][rows], shard["ref_log_probs"][rows], kl_type)
        shares["kl_to_ref"] = float((kl * mask).sum()) / global_tokens
    if "teacher_log_probs" in shard:
        gap = shard["old_log_probs"][rows].float() - shard["teacher_log_probs"][rows].float()
        shares["teacher_reverse_kl"] = float((gap * mask).sum()) / global_tokens
    engine_log_probs = shard.get("fields", {}).get("rollout_log_probs")
    if engine_log_probs is not None:
        engine = engine_log_probs[rows].float()
        gap = (engine - shard["old_log_probs"][rows].float()).abs()
        shares["logprob_abs_diff"] = float((gap * mask).sum()) / global_tokens
    return shares


def off_policy_weight_metrics(shard: dict, algorithm_config, process_group=None,
                              device: torch.device | None = None) -> dict[str, float]:
    """The step's importance-weight diagnostics (``numerics.weight_statistics``: pre-cap quantiles,
    effective sample size, capped share) for ``--off-policy-correction``, logged as ``off_policy/*``.

    Quantiles are not shares, so the units (tokens or sequences, as the correction weighs them) of
    every data-parallel rank are gathered first: every rank of ``process_group`` calls this, also one
    that holds nothing this step, and all return the whole step's numbers. The weights are those the
    first mini-batch sees: the old log-probs are computed before the step's first update. ``device``:
    the model's (default the CPU), where the units are gathered: an NCCL group gathers GPU tensors only."""
    mode, cap = algorithm_config.off_policy_correction, algorithm_config.off_policy_cap
    engine = shard.get("fields", {}).get("rollout_log_probs")
    device = torch.device("cpu") if device is None else device
    if shard.get("batch") is None or engine is None:
        local = torch.zeros(0, dtype=torch.float64, device=device)
    else:
        local = numerics.unit_log_weights(shard["old_log_probs"].detach().float().to(device),
                                          engine.float().to(device), shard["batch"].response_mask.to(device), mode)
    whole, _ = numerics.all_gather_rows(local, process_group)
    return {f"off_policy/{k}": v for k, v in numerics.weight_statistics(whole, mode, cap).items()}
