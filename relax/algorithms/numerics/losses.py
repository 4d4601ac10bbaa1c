"""Loss aggregation, the clipped value loss and the PPO surrogate."""

from __future__ import annotations

import torch

from relax.algorithms.numerics.constants import LOSS_AGGREGATIONS


def aggregate(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token_mean",
    *,
    global_num_tokens: float | None = None,
    global_num_sequences: float | None = None,
    max_response_length: int | None = None,
) -> torch.Tensor:
    """Reduce a ``[N, T]`` per-token quantity to a scalar; masked positions never contribute.

    - ``token_mean``: sum over valid tokens / number of valid tokens (or ``global_num_tokens``);
    - ``seq_mean_token_mean``: mean over sequences of each sequence's token mean;
    - ``seq_mean_token_sum``: mean over sequences of each sequence's token sum;
    - ``seq_mean_token_sum_norm``: the sum over valid tokens / (B * L_max), B the number of
      sequences and L_max = ``max_response_length``, the generation limit
      (``--rollout-max-response-len``), not the longest response of the batch: a constant divisor, so
      a token weighs the same in a short and a long response and in every batch (Dr. GRPO's
      normalization; verl's ``seq-mean-token-sum-norm``, TRL's ``dr_grpo``).

    "Sequences" are those with at least one valid token; ``global_num_sequences`` replaces their local
    count as the divisor (so micro-batch losses add up to the mini-batch loss).
    """
    mask = mask.to(torch.bool)
    x = torch.where(mask, per_token, torch.zeros((), dtype=per_token.dtype, device=per_token.device))
    if mode == "token_mean":
        denom = global_num_tokens if global_num_tokens is not None else mask.sum().clamp(min=1)
        return x.sum() / denom
    if mode not in LOSS_AGGREGATIONS:
        raise ValueError(f"unknown loss_aggregation {mode!r}; choose one of {', '.join(LOSS_AGGREGATIONS)}")
    tokens_per_seq = mask.sum(dim=1)
    if global_num_sequences is not None:
        denom = global_num_sequences
    else:
        denom = (tokens_per_seq > 0).sum().clamp(min=1)
    seq_sum = x.sum(dim=1)
    if mode == "seq_mean_token_sum_norm":
        if max_response_length is None or max_response_length < 1:
            raise ValueError(
                "loss_aggregation seq_mean_token_sum_norm divides by the generation limit L_max, but "
                f"max_response_length is {max_response_length!r}; pass the run's --rollout-max-response-len"
            )
        return seq_sum.sum() / (denom * max_response_length)
    per_seq = seq_sum / tokens_per_seq.clamp(min=1) if mode == "seq_mean_token_mean" else seq_sum
    return per_seq.sum() / denom


def masked_inputs(mask: torch.Tensor, *tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
    """Replace masked positions by 0 (keeping autograd): NaN/inf in padding can't reach loss or grads."""
    mask = mask.to(torch.bool)
    return [None if t is None else torch.where(mask, t, torch.zeros((), dtype=t.dtype, device=t.device))
            for t in tensors]


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    value_clip: float | None = 0.2,
    mode: str = "token_mean",
    *,
    global_num_tokens: float | None = None,
    global_num_sequences: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped critic loss ``max((V - R)^2, (V_old + clip(V - V_old, ±c) - R)^2)`` -> (loss, clipfrac).

    ``value_clip`` None disables the clipped term. Aggregated like the policy loss.
    """
    values, old_values, returns = masked_inputs(mask, values, old_values, returns)
    unclipped = (values - returns) ** 2
    if value_clip is None:
        per_token, clipped_more = unclipped, torch.zeros_like(unclipped, dtype=torch.bool)
    else:
        v_clip = old_values + (values - old_values).clamp(-value_clip, value_clip)
        clipped = (v_clip - returns) ** 2
        per_token, clipped_more = torch.maximum(unclipped, clipped), clipped > unclipped
    kw = dict(global_num_tokens=global_num_tokens, global_num_sequences=global_num_sequences)
    loss = aggregate(per_token, mask, mode, **kw)
    clipfrac = aggregate(clipped_more.to(per_token.dtype), mask, mode, **kw).detach()
    return loss, clipfrac


def ppo_clip_loss(
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    eps_low: float,
    eps_high: float,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token PPO clipped surrogate (negated) -> ``(loss [N, T], {flag name: bool [N, T]})``.

    L = max(-r A, -clip(r, 1 - eps_low, 1 + eps_high) A) with r = exp(log_ratio); flag
    ``pg_clipfrac`` marks tokens where the clipped term wins. Dual clip (``dual_clip`` = c > 1): for
    A < 0 the loss is capped at -c A, so a huge ratio on a negative-advantage token cannot blow up
    the loss; flag ``dual_clipfrac`` marks the tokens where the cap acts.
    """
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    loss = torch.maximum(unclipped, clipped)
    flags = {"pg_clipfrac": clipped > unclipped}
    if dual_clip is not None:
        cap = -advantages * dual_clip
        capped = (advantages < 0) & (loss > cap)
        loss = torch.where(capped, cap, loss)
        flags["dual_clipfrac"] = capped
    return loss, flags
