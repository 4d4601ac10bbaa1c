"""Correcting a loss for samples drawn by a behaviour policy, and measuring the mismatch.

``proximal_log_probs`` are the trainer's log-probs before this step's updates (``old_log_probs``:
PPO's ratio is taken against them), ``behaviour_log_probs`` the rollout's sampling log-probs, of an
older policy version or of an engine with its own kernels (vLLM, bf16). Per token
``w_t = exp(proximal - behaviour) = pi_old / pi_behaviour``; per sequence the product
``W_i = prod_t w_t`` (sequence-level importance sampling) or the geometric mean
``g_i = exp(mean_t log w_t)`` (a length-independent measure of how far the sequence is off-policy).
"""

from __future__ import annotations

import torch

from relax.algorithms.numerics.constants import OFF_POLICY_CORRECTIONS

# the corrections that look at whole sequences (they need the response mask)
SEQUENCE_CORRECTIONS = ("seq_tis", "seq_mask_tis")


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
    if mode == "seq_tis":
        seq = torch.exp(_per_sequence_log_weight(log_w, mask, mean=False))  # inf past float64's range: capped
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
