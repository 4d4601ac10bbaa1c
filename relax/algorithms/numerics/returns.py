"""Terminal-reward placement, GAE and discounted-return scans over masked ``[N, T]``."""

from __future__ import annotations

import torch


def broadcast_to_tokens(per_sample: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``[N]`` -> ``[N, T]``: the sample's value on each valid token, 0 elsewhere (float32)."""
    v = per_sample.to(torch.float32)[:, None].expand(mask.shape)
    return torch.where(mask.to(torch.bool), v, torch.zeros((), dtype=torch.float32, device=v.device))


def last_valid_index(mask: torch.Tensor) -> torch.Tensor:
    """Per row: the index of the last true position of ``mask``, or -1 if the row has none."""
    n, t_len = mask.shape
    if t_len == 0:
        return torch.full((n,), -1, dtype=torch.int64, device=mask.device)
    t = torch.arange(t_len, device=mask.device).expand(n, t_len)
    return torch.where(mask.to(torch.bool), t, torch.full_like(t, -1)).max(dim=1).values


def terminal_token_rewards(scores: torch.Tensor, mask: torch.Tensor, dtype=torch.float64) -> torch.Tensor:
    """``[N]`` -> ``[N, T]``: each score on its row's LAST VALID token (a fully masked row gets nothing)."""
    out = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    last = last_valid_index(mask)
    rows = (last >= 0).nonzero().squeeze(1)
    out[rows, last[rows]] = scores[rows].to(dtype)
    return out


def token_rewards(
    scores: torch.Tensor, mask: torch.Tensor, kl: torch.Tensor | None, kl_coef: float
) -> torch.Tensor:
    """``-kl_coef * kl`` on every valid token plus the score on the last valid token; float64, 0 if masked."""
    mask = mask.to(torch.bool)
    r = terminal_token_rewards(scores, mask)
    if kl_coef != 0.0:
        if kl is None:
            raise ValueError(
                f"kl_coef={kl_coef} shapes the rewards with a per-token KL, but AdvantageInputs.kl is None; "
                "compute it from old and reference log-probs (numerics.kl_estimate) or set --kl-coef 0"
            )
        r = r - kl_coef * torch.where(mask, kl.to(torch.float64), kl.new_zeros((), dtype=torch.float64))
    return r


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation over the valid tokens of each row -> ``(advantages, returns)``.

    delta_t = r_t + gamma * V_next - V_t, A_t = delta_t + gamma * lam * A_next, R_t = A_t + V_t,
    where "next" is the next VALID token of the row (masked positions are skipped, so holes in the
    mask are handled) and V after the last valid token is 0. float64 inside; zeros where masked.
    A Python loop over T (vectorized over rows); the per-step work is a handful of kernels.
    """
    mask = mask.to(torch.bool)
    r, v = rewards.to(torch.float64), values.to(torch.float64)
    zero = torch.zeros((), dtype=torch.float64, device=r.device)
    r = torch.where(mask, r, zero)
    v = torch.where(mask, v, zero)
    n, t_len = mask.shape
    adv = torch.zeros((n, t_len), dtype=torch.float64, device=r.device)
    next_v = torch.zeros(n, dtype=torch.float64, device=r.device)
    next_a = torch.zeros(n, dtype=torch.float64, device=r.device)
    for t in range(t_len - 1, -1, -1):
        m = mask[:, t]
        a = r[:, t] + gamma * next_v - v[:, t] + (gamma * lam) * next_a
        adv[:, t] = torch.where(m, a, zero)
        next_a = torch.where(m, a, next_a)
        next_v = torch.where(m, v[:, t], next_v)
    returns = torch.where(mask, adv + v, zero)
    return adv, returns


def discounted_returns(rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = sum_{u >= t, u valid} gamma^(#valid tokens between) r_u over valid tokens; float64, 0 if masked.

    gamma == 1 uses a reverse cumulative sum; otherwise the GAE scan with V = 0 and lambda = 1.
    """
    mask = mask.to(torch.bool)
    zero = torch.zeros((), dtype=torch.float64, device=mask.device)
    r = torch.where(mask, rewards.to(torch.float64), zero)
    if gamma == 1.0:
        g = r.flip(1).cumsum(1).flip(1)
        return torch.where(mask, g, zero)
    return gae(r, torch.zeros_like(r), mask, gamma, 1.0)[0]
