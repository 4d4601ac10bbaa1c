"""Divergences between a teacher's and a student's next-token distributions (GKD, Agarwal et al. 2023).

Convention (the GKD paper's and the usual one): P is the teacher, Q the student, and for ``beta`` in
(0, 1) the generalized Jensen-Shannon divergence is

    JSD_beta(P || Q) = beta KL(P || M) + (1 - beta) KL(Q || M),    M = beta P + (1 - beta) Q.

It is 0 at both ends (M becomes Q or P); its scaled limits are the two KL divergences,
JSD_beta / beta -> KL(P || Q) (the *forward* KL, teacher || student) as beta -> 0 and
JSD_beta / (1 - beta) -> KL(Q || P) (the *reverse* KL, student || teacher) as beta -> 1. At
``beta == 0`` and ``beta == 1`` this module returns those limits, so ``beta`` runs from the
mode-covering forward KL through the symmetric JSD (0.5) to the mode-seeking reverse KL.

A distribution is given as log-probs over its last dimension (``[..., K]``): the whole vocabulary, or
the teacher's top-k tokens plus one "rest" bin holding the mass of every other token
(``with_rest_bin``). Merging tokens into one bin can only lower a divergence (data processing), so the
top-k value is a lower bound of the whole-vocabulary one, exact when k covers the vocabulary.

Zero-probability bins (a token the sampling truncation dropped, or an empty rest bin) contribute 0 and
no NaN gradient: every ``p log p`` term is selected with ``torch.where`` on p > 0. Inside (0, 1) the
mixture covers both supports, so the divergence stays finite (at most log 2 for beta = 0.5); at the ends
a token one side gives mass and the other none makes the KL infinite (here: huge), which is why
``beta`` strictly inside (0, 1) suits a truncated sampling distribution (``--rollout-top-p`` ...).
"""

from __future__ import annotations

import math

import torch


def teacher_top_k(log_probs_all: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[..., V]`` log-probs -> ``(ids int64 [..., k'], log_probs [..., k'])`` of the k' = min(k, V) most
    likely tokens, in decreasing probability; ``k <= 0`` keeps the whole vocabulary (ids in token order).

    What a teacher pass keeps of each position's distribution: [N, T, k'] instead of [N, T, V]."""
    vocab = log_probs_all.shape[-1]
    if k <= 0 or k >= vocab:
        ids = torch.arange(vocab, device=log_probs_all.device).expand(log_probs_all.shape)
        return ids.contiguous(), log_probs_all
    top = log_probs_all.topk(k, dim=-1)
    return top.indices, top.values


def with_rest_bin(log_probs: torch.Tensor) -> torch.Tensor:
    """``[..., k]`` log-probs of some tokens -> ``[..., k + 1]``: the same and the log of the rest mass
    ``1 - sum(exp(log_probs))`` (clamped at the smallest normal float, so an empty rest bin stays finite
    and passes no gradient)."""
    rest = (1.0 - log_probs.exp().sum(dim=-1, keepdim=True)).clamp(min=torch.finfo(log_probs.dtype).tiny)
    return torch.cat([log_probs, rest.log()], dim=-1)


def _kl_terms(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """``sum p (log p - log q)`` over the last dimension, 0 where p is 0 (value and gradient)."""
    positive = log_p.exp() > 0
    safe_p = torch.where(positive, log_p, torch.zeros_like(log_p))
    safe_q = torch.where(positive, log_q, torch.zeros_like(log_q))
    terms = torch.where(positive, safe_p.exp() * (safe_p - safe_q), torch.zeros_like(log_p))
    return terms.sum(dim=-1)


def generalized_jsd(student_log_probs: torch.Tensor, teacher_log_probs: torch.Tensor, beta: float) -> torch.Tensor:
    """``JSD_beta(teacher || student)`` per position: two ``[..., K]`` log-prob tensors over the same bins
    -> ``[...]``. ``beta`` 0: forward KL(teacher || student); 1: reverse KL(student || teacher) (the
    module docstring). Differentiable in both; a caller detaches the teacher."""
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must lie in [0, 1] (0: forward KL, 1: reverse KL), got {beta!r}")
    if student_log_probs.shape != teacher_log_probs.shape:
        raise ValueError(
            f"student and teacher log-probs must cover the same bins: shapes {tuple(student_log_probs.shape)} "
            f"and {tuple(teacher_log_probs.shape)}"
        )
    if beta == 0.0:
        return _kl_terms(teacher_log_probs, student_log_probs)
    if beta == 1.0:
        return _kl_terms(student_log_probs, teacher_log_probs)
    log_mixture = torch.logaddexp(teacher_log_probs + math.log(beta), student_log_probs + math.log1p(-beta))
    return beta * _kl_terms(teacher_log_probs, log_mixture) + (1.0 - beta) * _kl_terms(student_log_probs, log_mixture)


def reverse_kl(student_log_probs: torch.Tensor, teacher_log_probs: torch.Tensor) -> torch.Tensor:
    """``KL(student || teacher)`` per position over the last dimension (bins as in ``generalized_jsd``)."""
    return _kl_terms(student_log_probs, teacher_log_probs)
