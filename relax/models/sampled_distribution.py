"""The distribution a rollout engine samples from, replayed on any logits: one rule for the engines
and the trainer.

An engine samples from the temperature-scaled softmax restricted to a *kept set* and renormalized
(``--rollout-min-p``, ``--rollout-top-k``, ``--rollout-top-p``), and reports the log-probs of that
truncated distribution. A trainer that scored the full vocabulary would give every sampled token
``log pi - log(kept mass)`` less than the engine did, so each importance weight
``pi_old / pi_behaviour`` would be the kept mass, not 1, on-policy. The trainer therefore rebuilds the
kept set from its own logits with this module's rule and renormalizes over it.

The rule, applied to ``scores = logits / temperature`` (temperature first, as every engine does):

1. min-p: drop a token whose probability is below ``min_p`` times the most likely token's;
2. top-k: drop a token whose score is below the k-th largest of the survivors (ties with the k-th
   stay; ``k >= V`` drops nothing);
3. top-p: among the survivors, renormalized and sorted by decreasing probability (equal scores in
   increasing token id: a stable sort, so ties are broken the same way on every device), drop a token
   when the mass of the tokens before it already reaches ``top_p`` (the most likely token always stays);
4. the token that was sampled always stays: where the trainer's logits differ from the engine's in the
   last bits, a boundary token could otherwise fall out and get log-prob -inf.

Dropped tokens get the most negative finite float as their log-prob (probability exactly 0), so an
entropy ``-sum p log p`` over the truncated distribution and its gradient stay finite.
"""

from __future__ import annotations

import attrs
import torch


@attrs.frozen
class Truncation:
    """The sampling settings that truncate the vocabulary (``--rollout-top-p/-top-k/-min-p``)."""

    top_p: float = 1.0
    top_k: int = 0  # 0: no top-k
    min_p: float = 0.0  # 0: no min-p

    @property
    def truncates(self) -> bool:
        return self.top_p < 1.0 or self.top_k > 0 or self.min_p > 0.0

    @classmethod
    def of_run(cls, config) -> Truncation | None:
        """The truncation the trainer replays for a ``RunConfig``: None when sampling keeps the whole
        vocabulary or the run asks for full-vocabulary log-probs (``--full-vocabulary-log-probs``)."""
        if config.algorithm.full_vocabulary_log_probs:
            return None
        truncation = cls(top_p=config.rollout_top_p, top_k=config.rollout_top_k, min_p=config.rollout_min_p)
        return truncation if truncation.truncates else None


# Positions decided at once: top-p's sort holds a few temporaries of the chunk's size (sorted scores, int64
# indices, probabilities, their cumulative sum), so 2**26 elements keep them near 1 GiB at any vocabulary
# (a 152k vocabulary: 441 positions a chunk) instead of growing with the batch.
_CHUNK_ELEMENTS = 2**26


@torch.no_grad()
def dropped_tokens(scores: torch.Tensor, truncation: Truncation, sampled: torch.Tensor | None = None) -> torch.Tensor:
    """bool ``[..., V]``: the tokens outside the kept set of ``scores`` (temperature already applied).

    ``sampled`` (``[...]`` token ids): tokens that stay whatever the rule says (step 4 above)."""
    vocab = scores.shape[-1]
    flat = scores.reshape(-1, vocab)
    flat_sampled = None if sampled is None else sampled.reshape(-1)
    rows = max(1, _CHUNK_ELEMENTS // max(vocab, 1))
    drop = torch.zeros(flat.shape, dtype=torch.bool, device=scores.device)
    for start in range(0, flat.shape[0], rows):
        chunk = slice(start, start + rows)
        drop[chunk] = _dropped_rows(flat[chunk], truncation, None if flat_sampled is None else flat_sampled[chunk])
    return drop.reshape(scores.shape)


def _dropped_rows(scores: torch.Tensor, truncation: Truncation, sampled: torch.Tensor | None) -> torch.Tensor:
    """``dropped_tokens`` of ``[R, V]`` rows."""
    scores = scores.float()
    drop = torch.zeros(scores.shape, dtype=torch.bool, device=scores.device)
    if truncation.min_p > 0.0:
        probs = torch.softmax(scores, dim=-1)
        drop |= probs < truncation.min_p * probs.amax(dim=-1, keepdim=True)
    vocab = scores.shape[-1]
    if 0 < truncation.top_k < vocab:
        survivors = scores.masked_fill(drop, float("-inf"))
        kth = survivors.topk(truncation.top_k, dim=-1).values[..., -1:]
        drop |= survivors < kth
    if truncation.top_p < 1.0:
        survivors = scores.masked_fill(drop, float("-inf"))
        sorted_scores, order = survivors.sort(dim=-1, descending=True, stable=True)
        probs = torch.softmax(sorted_scores, dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs
        drop_sorted = mass_before >= truncation.top_p
        drop_sorted[..., 0] = False
        drop |= torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    if sampled is not None:
        drop.scatter_(-1, sampled.unsqueeze(-1), False)
    return drop


def sampled_log_softmax(scores: torch.Tensor, truncation: Truncation | None,
                        sampled: torch.Tensor | None = None) -> torch.Tensor:
    """Log-probs ``[..., V]`` (float32) of the distribution sampled from: ``log_softmax(scores)`` over
    the kept set, the most negative finite float elsewhere; the whole vocabulary when ``truncation``
    is None. Differentiable in the kept scores (the kept set itself is a discrete choice)."""
    scores = scores.float()
    if truncation is not None and truncation.truncates:
        lowest = torch.finfo(scores.dtype).min
        scores = scores.masked_fill(dropped_tokens(scores, truncation, sampled), lowest)
    return torch.log_softmax(scores, dim=-1)


def entropy_of(log_probs_all: torch.Tensor) -> torch.Tensor:
    """``-sum p log p`` over the last dimension of ``sampled_log_softmax``'s output (dropped tokens,
    with p exactly 0, add nothing)."""
    return -(log_probs_all.exp() * log_probs_all).sum(-1)
