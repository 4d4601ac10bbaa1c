"""Correcting a loss for samples drawn by a behaviour policy, and measuring the mismatch.

``proximal_log_probs`` are the trainer's log-probs before this step's updates (``old_log_probs``:
PPO's ratio is taken against them), ``behaviour_log_probs`` the rollout's sampling log-probs, of an
older policy version or of an engine with its own kernels (vLLM, bf16). Per token
``w_t = exp(proximal - behaviour) = pi_old / pi_behaviour``; per sequence the product
``W_i = prod_t w_t`` (sequence-level importance sampling) or the geometric mean
``g_i = exp(mean_t log w_t)`` (a length-independent measure of how far the sequence is off-policy:
a small per-token mismatch compounds in ``W_i`` over thousands of tokens, not in ``g_i``).
"""

from __future__ import annotations

import math

import torch

from relax.algorithms.numerics.constants import OFF_POLICY_CORRECTIONS

# the corrections that look at whole sequences (they need the response mask)
SEQUENCE_CORRECTIONS = ("seq_tis", "seq_geo_tis", "seq_mask_tis")


def _per_sequence_log_weight(log_w: torch.Tensor, mask: torch.Tensor, *, mean: bool) -> torch.Tensor:
    """``[N, T]`` per-token log-weights -> ``[N]``: their sum (or mean) over the valid tokens, float64."""
    x = torch.where(mask, log_w.to(torch.float64), torch.zeros((), dtype=torch.float64, device=log_w.device))
    total = x.sum(1)
    return total / mask.sum(1).clamp(min=1) if mean else total


def behaviour_weights(
    proximal_log_probs: torch.Tensor, behaviour_log_probs: torch.Tensor, mode: str, cap: float,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token weights that correct a loss for samples drawn by a behaviour policy -> ``(weight, capped)``.

    With ``w = exp(proximal - behaviour)`` per token and C = ``cap``:

    - ``tis``: truncated importance sampling, ``min(w, C)``;
    - ``decoupled``: the decoupled PPO objective, ``w`` itself, and tokens with ``w > C`` get
      weight 0 (they are dropped rather than down-weighted);
    - ``seq_tis``: truncated sequence-level importance sampling, every token of sequence i weighted by
      ``min(W_i, C)``, ``W_i = prod_t w_t`` over its valid tokens; ``capped`` marks the sequences at C;
    - ``seq_geo_tis``: the same with the length-normalized weight ``min(g_i, C)``,
      ``g_i = exp(mean_t log w_t)`` the geometric mean of the sequence's token ratios;
    - ``seq_mask_tis``: masked importance sampling: a sequence whose geometric-mean weight ``g_i``
      leaves the band ``[1/C, C]`` is rejected (weight 0 on every token), the others get the token
      TIS weight ``min(w, C)``; ``capped`` marks the tokens of rejected sequences and the capped tokens.

    The sequence modes need ``mask`` (the response mask). The weights carry no gradient.
    """
    if mode not in OFF_POLICY_CORRECTIONS or mode == "none":
        raise ValueError(f"mode must be one of {OFF_POLICY_CORRECTIONS[1:]}, got {mode!r}")
    if mode in SEQUENCE_CORRECTIONS:
        if mask is None:
            raise ValueError(f"off-policy correction {mode!r} weighs whole sequences: pass the response mask")
        return _sequence_weights(proximal_log_probs, behaviour_log_probs, mode, cap, mask.to(torch.bool))
    weight = torch.exp((proximal_log_probs - behaviour_log_probs).detach())
    capped = weight > cap
    if mode == "tis":
        return weight.clamp(max=cap), capped
    return torch.where(capped, torch.zeros_like(weight), weight), capped


def _sequence_weights(proximal, behaviour, mode, cap, mask):
    log_w = (proximal - behaviour).detach()
    if mode in ("seq_tis", "seq_geo_tis"):
        # the product's log can pass float64's range (inf): then it is capped
        seq = torch.exp(_per_sequence_log_weight(log_w, mask, mean=mode == "seq_geo_tis"))
        capped = (seq > cap)[:, None].expand_as(mask)
        return seq.clamp(max=cap).to(proximal.dtype)[:, None].expand_as(mask).clone(), capped
    g = torch.exp(_per_sequence_log_weight(log_w, mask, mean=True))
    rejected = ((g < 1.0 / cap) | (g > cap))[:, None].expand_as(mask)
    token = torch.exp(log_w)
    weight = torch.where(rejected, torch.zeros_like(token), token.clamp(max=cap))
    return weight, rejected | (token > cap)


def mismatch_metrics(proximal_log_probs: torch.Tensor, behaviour_log_probs: torch.Tensor,
                     mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-token diagnostics of the behaviour / trainer mismatch (``[N, T]``, 0 where masked; the
    caller aggregates them like the loss):

    - ``mismatch_kl``: the k3 estimate of KL(pi_behaviour || pi_old) on tokens sampled from the
      behaviour policy, ``w - 1 - log w`` with ``w = pi_old / pi_behaviour`` (non-negative, 0 on-policy);
    - ``mismatch_ppl_ratio``: the sequence's perplexity under the trainer over its perplexity under
      the behaviour policy, ``exp(mean_t (behaviour - proximal))``, on each of its tokens (1 on-policy).
    """
    mask = mask.to(torch.bool)
    log_w = (proximal_log_probs - behaviour_log_probs).detach()
    zero = torch.zeros((), dtype=log_w.dtype, device=log_w.device)
    kl = torch.where(mask, torch.expm1(log_w) - log_w, zero)
    ratio = torch.exp(-_per_sequence_log_weight(log_w, mask, mean=True)).to(log_w.dtype)
    return {"mismatch_kl": kl, "mismatch_ppl_ratio": torch.where(mask, ratio[:, None], zero)}


def unit_log_weights(proximal_log_probs: torch.Tensor, behaviour_log_probs: torch.Tensor, mask: torch.Tensor,
                     mode: str) -> torch.Tensor:
    """float64 ``[n]``: the log of the weights ``mode`` caps, before the cap, one per unit: each valid
    token's ``log w_t`` (``tis``, ``decoupled``), or each sequence's (with a valid token) ``log W_i``
    (``seq_tis``) or ``log g_i`` (``seq_geo_tis``, and ``seq_mask_tis``, whose band tests ``g_i``)."""
    mask = mask.to(torch.bool)
    log_w = (proximal_log_probs - behaviour_log_probs).detach().to(torch.float64)
    if mode not in SEQUENCE_CORRECTIONS:
        return log_w[mask]
    per_seq = _per_sequence_log_weight(log_w, mask, mean=mode != "seq_tis")
    return per_seq[mask.any(1)]


def weight_statistics(log_weights: torch.Tensor, mode: str, cap: float) -> dict[str, float]:
    """Diagnostics of the pre-cap weights ``exp(log_weights)`` (``unit_log_weights``, all of a step):

    - ``weight_p50`` / ``weight_p99``: quantiles of the log-weights (linear interpolation),
      exponentiated; ``weight_max``: the largest weight;
    - ``weight_ess``: the effective sample size over the number of units, ``(sum w)^2 / (n sum w^2)``
      in (0, 1] (1: all weights equal, as on-policy), computed in log space;
    - ``capped_share``: the share of units beyond the cap (outside ``[1/C, C]`` for ``seq_mask_tis``,
      whose band rejects both sides).

    Empty input (no valid token) gives an empty dict."""
    lw = log_weights.detach().to(torch.float64).flatten()
    n = lw.numel()
    if n == 0:
        return {}
    q = torch.exp(torch.quantile(lw, torch.tensor([0.5, 0.99], dtype=torch.float64, device=lw.device)))
    log_ess = 2 * torch.logsumexp(lw, 0) - torch.logsumexp(2 * lw, 0) - math.log(n)
    log_cap = math.log(cap)
    beyond = (lw > log_cap) | (lw < -log_cap) if mode == "seq_mask_tis" else lw > log_cap
    return {"weight_p50": float(q[0]), "weight_p99": float(q[1]), "weight_max": float(torch.exp(lw.max())),
            "weight_ess": float(torch.exp(log_ess)), "capped_share": float(beyond.to(torch.float64).mean())}
