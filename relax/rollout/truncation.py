"""Which responses were cut at the generation limit, and DAPO's over-long filtering of them.

A response is truncated when it reached ``max_new_tokens`` without ending in the end-of-sequence
token: the model did not finish, the limit stopped it. Over-long filtering (DAPO, arXiv:2503.14476,
section 3.4) keeps such a sample out of the loss, since its reward judges an answer that was never
finished: its loss mask is emptied, so the loss's token and sequence counts exclude it, while its
reward still enters its group's statistics.
"""

from __future__ import annotations

import torch


def truncated_rows(response_ids: torch.Tensor, response_mask: torch.Tensor, max_new_tokens: int,
                   eos_id: int) -> torch.Tensor:
    """bool ``[N]``: the rows whose response has ``max_new_tokens`` valid tokens and whose last valid
    token is not ``eos_id``."""
    mask = response_mask.to(torch.bool)
    lengths = mask.sum(1)
    full = lengths >= max_new_tokens
    if mask.shape[1] == 0:
        return full
    last = (lengths - 1).clamp(min=0)
    last_token = response_ids.gather(1, last[:, None]).squeeze(1)
    return full & (last_token != eos_id)


def filter_overlong(response_mask: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
    """The loss mask without the truncated rows (bool ``[N, T]``; a filtered row has no valid token)."""
    return response_mask.to(torch.bool) & ~truncated[:, None]
