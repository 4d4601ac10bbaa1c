"""Multi-reward diagnostics of one training step, and their end-of-run summary.

The functions below read the raw ``[N, K]`` reward matrix of one rollout (columns in
``reward_keys`` order), the prompt-group ids, the reward weights and optionally the final
per-sample advantages, and return a flat ``{metric name: float}`` dict for ``metrics.jsonl``.
Group reductions are ``numerics.Groups`` scatters (no Python loop over groups), in float64.

- ``reward_statistics``: what holds whatever method trains on the rewards (``reward/*``,
  ``multi_reward/*``, ``advantage/*``); ``RLAlgorithm.reward_diagnostics`` logs it.
- ``gdpo_advantage_shares``: ``gdpo/<key>/adv_share`` at a given ``std_eps``; GDPO's
  ``reward_diagnostics`` adds it with the epsilon it trains with.
- ``reward_diagnostics``: both at once, for scripts that inspect rewards without an algorithm.

Definitions (``g`` a prompt group, ``k`` a component, ``w_k`` its weight, ``r_ik`` the raw reward):

- ``reward/<key>/mean``, ``reward/<key>/std``: mean and *population* std (ddof 0) of ``r_k`` over all
  N samples of the step.
- ``reward/<key>/zero_std_frac``: fraction of groups in which ``r_k`` is constant (exact equality):
  the component carries no within-group signal there.
- ``gdpo/<key>/adv_share``: component k's share of GDPO's combined advantage *before* batch
  whitening. With GDPO's per-group, per-component normalization
  ``z_ik = (r_ik - mean_g(r_k)) / (std_g(r_k) + std_eps)`` (unbiased std; exactly 0 where ``r_k`` is
  constant in the group) the contribution is ``c_ik = w_k * z_ik`` and
  ``share_k = mean_i |c_ik| / sum_k' mean_i |c_ik'|``. The shares sum to 1. Batch whitening is one
  affine map applied to ``sum_k c_ik`` and does not change how the components split it. The keys are
  omitted for a step in which every component is constant in every group (0/0).
- ``multi_reward/varied_group_frac``: fraction of groups holding at least two distinct reward tuples
  (some component varies within the group).
- ``multi_reward/collapse_rate``: fraction of groups with at least two distinct reward tuples whose
  weighted sums ``s_i = sum_k w_k r_ik`` are nevertheless all equal — so GRPO (which normalizes
  ``s``) gets no signal from them — while GDPO's combination ``sum_k w_k z_ik`` still varies. This is
  the signal GRPO throws away and GDPO keeps, whichever of the two is training.
- ``multi_reward/gdpo_cancel_rate``: fraction of groups with at least two distinct reward tuples in
  which GDPO's combination ``sum_k w_k z_ik`` is constant too (components that cancel exactly after
  per-component normalization and weighting, e.g. two equal-weight 0/1 components that always sum to
  1). Neither method learns from these; they are *not* counted in ``collapse_rate``, so the two
  numbers never overstate GDPO. This test uses the z-scores *without* ``std_eps`` (so it does not
  depend on the method's epsilon): the epsilon makes components of different scales cancel only up
  to a residue of order ``std_eps / std`` (e.g. rewards {2, 0} and {0, 1} give ±0.70706 and
  ∓0.70700), which is not a usable signal.
- ``advantage/mean``, ``advantage/std`` (ddof 0), ``advantage/zero_frac`` (fraction of samples whose
  final advantage is exactly 0), from the advantages the step actually trained on.

"All equal" for the two rates means: the spread (max - min) within the group is at most ``rtol``
times the group's magnitude (``sum_k |w_k| * max_i |r_ik|`` for ``s``, ``sum_k |w_k| * max_i |z_ik|``
for GDPO's combination). Rewards travel as float32 and a weighted sum of K components rounds, so
exact float equality would miss sums that are equal in real arithmetic; ``rtol = 1e-6`` is about ten
float32 ulps, far below any spread GRPO's ``std + 1e-6`` denominator would still amplify.

The ``multi_reward/*`` and ``gdpo/*`` keys need at least two components and are omitted for K = 1.

The ``baseline`` of GDPO (mean or leave-one-out) does not change these numbers when all groups have
the same size: leave-one-out scales a group's ``z`` by the constant ``G / (G - 1)``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import attrs
import torch

from relax.algorithms import numerics

DEFAULT_RTOL = 1e-6
SUMMARY_PREFIXES = ("reward/", "gdpo/", "multi_reward/", "advantage/")


def _check_inputs(rewards, group_ids, reward_keys, reward_weights, advantages, response_mask):
    if not isinstance(rewards, torch.Tensor):
        raise TypeError(f"rewards must be a torch.Tensor [N, K], got {type(rewards).__name__}")
    if rewards.dim() == 1:
        rewards = rewards.unsqueeze(1)
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [N] or [N, K], got shape {tuple(rewards.shape)}")
    n, k = rewards.shape
    keys = tuple(reward_keys)
    if len(keys) != k:
        raise ValueError(f"reward_keys has {len(keys)} name(s) {keys} but rewards has {k} column(s)")
    weights = tuple(float(w) for w in reward_weights) if reward_weights is not None else (1.0,) * k
    if len(weights) != k:
        raise ValueError(f"reward_weights has {len(weights)} value(s) but there are {k} reward keys {keys}")
    if not all(math.isfinite(w) for w in weights):
        raise ValueError(f"reward_weights must be finite, got {weights}")
    groups = numerics.Groups(numerics.check_group_ids(group_ids, n))
    if n == 0:
        raise ValueError("reward_diagnostics needs at least one sample, got an empty batch")
    r = rewards.detach().to(torch.float64)
    bad = numerics.first_non_finite(r)
    if bad is not None:
        i, j = bad
        raise ValueError(f"reward {keys[j]!r} of sample {i} is {r[i, j].item()!r}, which is not finite")
    if advantages is None:
        return r, groups, keys, torch.tensor(weights, dtype=torch.float64), None
    adv = advantages.detach().to(torch.float64)
    if adv.dim() == 2:
        if response_mask is None or response_mask.shape != adv.shape:
            raise ValueError(
                f"advantages of shape {tuple(adv.shape)} need a response_mask of the same shape "
                "(or pass per-sample advantages [N])"
            )
        mask = response_mask.to(torch.float64)
        adv = (adv * mask).sum(1) / mask.sum(1).clamp_min(1.0)
    if adv.shape != (n,):
        raise ValueError(f"advantages must be [N] or [N, T] with N={n}, got shape {tuple(advantages.shape)}")
    return r, groups, keys, torch.tensor(weights, dtype=torch.float64), adv


def _gdpo_terms(r: torch.Tensor, groups: numerics.Groups, weights: torch.Tensor, std_eps: float):
    """``w_k * z_ik`` [N, K]: GDPO's step 1, weighted; exactly 0 where the column is constant in the
    group (also with ``std_eps`` 0, where the formula would give 0/0, and for groups of one).

    The plain formula (``group_standardize_unshifted``), not the first-member shift GDPO trains with:
    they differ only by rounding, and the plain one keeps the logged numbers bit-identical to those
    of earlier runs."""
    z = numerics.group_standardize_unshifted(r, groups, std_eps)
    return torch.where(groups.is_constant(r), 0.0, z) * weights


def _spread(groups: numerics.Groups, values: torch.Tensor, used: torch.Tensor) -> torch.Tensor:
    """Per used group row: max - min of ``values``."""
    return (groups.max(values) - groups.min(values))[used]


def reward_statistics(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    reward_keys: Sequence[str],
    reward_weights: Sequence[float] | None,
    advantages: torch.Tensor | None = None,
    *,
    response_mask: torch.Tensor | None = None,
    rtol: float = DEFAULT_RTOL,
) -> dict[str, float]:
    """``reward/*``, ``multi_reward/*`` and ``advantage/*`` of one step (definitions in the module
    docstring); none of them depends on the training method.

    Args:
        rewards: raw rewards ``[N, K]`` (or ``[N]`` for one component), columns in ``reward_keys`` order.
        group_ids: int ``[N]``; equal id = same prompt group (need not be contiguous).
        reward_keys: the K component names, used in the metric names.
        reward_weights: K weights (``None``: all 1).
        advantages: the final per-sample advantages ``[N]``, or ``[N, T]`` with ``response_mask``
            (then each sample's mean over its valid tokens is used); ``None`` omits ``advantage/*``.
            Call it on the whole rollout *before* the group filter drops groups without signal
            (otherwise the dropped groups, which are what ``gdpo_cancel_rate`` counts, are missing)
            and give dropped samples advantage 0, or pass ``None``.
        rtol: relative tolerance of "all equal" (see the module docstring).
    """
    r, groups, keys, w, adv = _check_inputs(
        rewards, group_ids, reward_keys, reward_weights, advantages, response_mask
    )
    used = groups.counts > 0  # Groups may index by the raw ids: rows of absent ids are empty
    gmax, gmin = groups.max(r)[used], groups.min(r)[used]
    constant = gmax == gmin  # [G, K]

    out: dict[str, float] = {}
    mean = r.mean(0)
    std = r.std(0, correction=0)
    zero_std = constant.to(torch.float64).mean(0)
    for j, key in enumerate(keys):
        out[f"reward/{key}/mean"] = float(mean[j])
        out[f"reward/{key}/std"] = float(std[j])
        out[f"reward/{key}/zero_std_frac"] = float(zero_std[j])

    if len(keys) >= 2:
        varied = ~constant.all(1)  # [G]: at least two distinct reward tuples
        sum_scale = torch.maximum(gmax.abs(), gmin.abs()) @ w.abs()
        sum_flat = _spread(groups, r @ w, used) <= rtol * sum_scale
        # Cancellation is judged on eps-free z-scores: with the std epsilon, two components of
        # different scales that cancel in exact z-score terms leave a residue of order
        # std_eps / std, which batch whitening would turn into noise, not signal.
        scale_free = _gdpo_terms(r, groups, w, 0.0)
        z_max = groups.max(scale_free.abs())[used]  # |w_k| * max_i |z_ik|
        gdpo_flat = _spread(groups, scale_free.sum(1), used) <= rtol * z_max.sum(1)
        out["multi_reward/varied_group_frac"] = float(varied.to(torch.float64).mean())
        out["multi_reward/collapse_rate"] = float((varied & sum_flat & ~gdpo_flat).to(torch.float64).mean())
        out["multi_reward/gdpo_cancel_rate"] = float((varied & gdpo_flat).to(torch.float64).mean())

    if adv is not None:
        out["advantage/mean"] = float(adv.mean())
        out["advantage/std"] = float(adv.std(correction=0))
        out["advantage/zero_frac"] = float((adv == 0).to(torch.float64).mean())
    return out


def gdpo_advantage_shares(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    reward_keys: Sequence[str],
    reward_weights: Sequence[float] | None,
    *,
    std_eps: float = numerics.GDPO_EPS,
) -> dict[str, float]:
    """``gdpo/<key>/adv_share`` of one step with GDPO's step-1 epsilon ``std_eps`` (arguments as in
    ``reward_statistics``). Empty for one component, or when nothing varies in any group."""
    r, groups, keys, w, _ = _check_inputs(rewards, group_ids, reward_keys, reward_weights, None, None)
    if len(keys) < 2:
        return {}
    abs_mean = _gdpo_terms(r, groups, w, std_eps).abs().mean(0)
    total = abs_mean.sum()
    if not total > 0:
        return {}
    return {f"gdpo/{key}/adv_share": float(abs_mean[j] / total) for j, key in enumerate(keys)}


def reward_diagnostics(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    reward_keys: Sequence[str],
    reward_weights: Sequence[float] | None,
    advantages: torch.Tensor | None,
    *,
    response_mask: torch.Tensor | None = None,
    std_eps: float = numerics.GDPO_EPS,
    rtol: float = DEFAULT_RTOL,
) -> dict[str, float]:
    """``reward_statistics`` and ``gdpo_advantage_shares`` together: every diagnostic of one step.

    The training loops log ``RLAlgorithm.reward_diagnostics`` instead (the shares only for GDPO);
    this is for scripts that compare what the methods would see on the same rewards.
    """
    out = reward_statistics(
        rewards, group_ids, reward_keys, reward_weights, advantages, response_mask=response_mask, rtol=rtol
    )
    out.update(gdpo_advantage_shares(rewards, group_ids, reward_keys, reward_weights, std_eps=std_eps))
    return out


@attrs.frozen
class MetricSummary:
    """Mean of one metric over the first and over the last ``window`` steps (``None``: never logged
    in that window)."""

    first: float | None
    last: float | None
    window: int


def summarize_diagnostics(
    steps: Sequence[Mapping[str, object]],
    *,
    fraction: float = 0.1,
    prefixes: Iterable[str] | None = SUMMARY_PREFIXES,
) -> dict[str, MetricSummary]:
    """First-``fraction`` vs last-``fraction`` means of every diagnostic over a run's per-step dicts.

    The window is ``max(1, ceil(fraction * len(steps)))`` steps. A metric missing from some steps
    (e.g. ``gdpo/*/adv_share`` on a step where nothing varied) is averaged over the steps of the
    window that have it. Only keys starting with one of ``prefixes`` are kept (``None``: all numeric
    keys); non-numeric values (and bools) are ignored.
    """
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    if not steps:
        return {}
    window = max(1, math.ceil(fraction * len(steps)))
    prefixes = tuple(prefixes) if prefixes is not None else None

    def numeric_items(row):
        for name, value in row.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if prefixes is None or name.startswith(prefixes):
                yield name, float(value)

    def window_means(rows):
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        for row in rows:
            for name, value in numeric_items(row):
                sums[name] = sums.get(name, 0.0) + value
                counts[name] = counts.get(name, 0) + 1
        return {name: sums[name] / counts[name] for name in sums}

    first = window_means(steps[:window])
    last = window_means(steps[-window:])
    names = sorted({name for row in steps for name, _ in numeric_items(row)})
    return {name: MetricSummary(first.get(name), last.get(name), window) for name in names}


def format_summary_table(summary: Mapping[str, MetricSummary]) -> str:
    """A markdown table of ``summarize_diagnostics``' output for the end-of-run report."""
    if not summary:
        return "(no diagnostics were logged)"
    window = next(iter(summary.values())).window
    lines = [f"| metric | first {window} step(s) | last {window} step(s) |", "|---|---:|---:|"]
    for name, s in summary.items():
        cells = ["—" if v is None else f"{v:.4g}" for v in (s.first, s.last)]
        lines.append(f"| {name} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)
