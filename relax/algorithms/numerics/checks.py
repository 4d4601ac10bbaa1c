"""Input checks (shapes, finiteness) with messages that name the sample and the reward key."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def first_non_finite(values: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[int, ...] | None:
    """Index (as a tuple) of the first non-finite element of ``values`` where ``mask`` holds, or None."""
    if not values.is_floating_point() or (values.numel() and bool(torch.isfinite(values.sum()))):
        return None  # a finite total proves every element finite (nan/inf propagate); the common case
    bad = ~torch.isfinite(values)
    if mask is not None:
        bad = bad & mask
    if not bool(bad.any()):
        return None
    return tuple(int(i) for i in bad.nonzero()[0])


def reward_matrix(rewards: torch.Tensor, reward_keys: Sequence[str]) -> torch.Tensor:
    """Check ``rewards`` (``[N]`` or ``[N, K]``, columns in ``reward_keys`` order) -> float64 ``[N, K]``.

    Raises ``ValueError`` naming the sample and the key of the first non-finite value.
    """
    if not isinstance(rewards, torch.Tensor):
        raise TypeError(f"rewards must be a torch.Tensor, got {type(rewards).__name__}")
    if rewards.dim() == 1:
        rewards = rewards[:, None]
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [N] or [N, K], got shape {tuple(rewards.shape)}")
    if rewards.shape[1] != len(reward_keys):
        raise ValueError(
            f"rewards has {rewards.shape[1]} column(s) but reward_keys lists {len(reward_keys)} "
            f"({', '.join(reward_keys)}); pass one column per reward key, in reward_keys order"
        )
    if not (rewards.is_floating_point() or rewards.dtype in (torch.int32, torch.int64)):
        raise TypeError(f"rewards must be a float tensor, got dtype {rewards.dtype}")
    where = first_non_finite(rewards) if rewards.is_floating_point() else None
    if where is not None:
        i, k = where
        n_bad = int((~torch.isfinite(rewards)).sum())
        raise ValueError(
            f"reward {reward_keys[k]!r} of sample {i} is {rewards[i, k].item()!r} ({n_bad} non-finite value(s) "
            "in this batch). Reward functions must return finite numbers; fix the reward function or drop "
            "the sample before normalization."
        )
    return rewards.to(torch.float64)


def weighted_sum(rewards64: torch.Tensor, weights: Sequence[float]) -> torch.Tensor:
    """``[N, K]`` float64 -> ``[N]`` float64: sum_k w_k * r_k."""
    w = torch.tensor(tuple(weights), dtype=torch.float64, device=rewards64.device)
    if rewards64.shape[1] == 1 and float(w[0]) == 1.0:
        return rewards64[:, 0].clone()
    return rewards64 @ w


def check_group_ids(group_ids: torch.Tensor, n: int) -> torch.Tensor:
    """Validate ``group_ids`` (integer ``[N]``) -> int64."""
    if not isinstance(group_ids, torch.Tensor):
        raise TypeError(f"group_ids must be a torch.Tensor, got {type(group_ids).__name__}")
    if group_ids.dim() != 1 or group_ids.shape[0] != n:
        raise ValueError(
            f"group_ids must be a 1-D tensor of {n} ids (one per sample), got shape {tuple(group_ids.shape)}"
        )
    if group_ids.is_floating_point() or group_ids.is_complex() or group_ids.dtype == torch.bool:
        raise TypeError(f"group_ids must be an integer tensor, got dtype {group_ids.dtype}")
    return group_ids.to(torch.int64)
