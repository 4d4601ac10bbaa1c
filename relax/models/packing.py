"""Token-budget micro-batches and padding-free packing (``--max-tokens-per-micro-batch``).

A padded ``TokenBatch`` computes every row at the full width ``P + T``. Here the samples of a
mini-batch are grouped by their real token count (prompt + response, padding excluded) into
micro-batches of at most ``budget`` tokens (first-fit decreasing: longest sample first, each into the
first micro-batch with room), and the real tokens of one micro-batch are concatenated into a single
row. Position ids restart at 0 for each sample, and attention stays within each sample (the model
forward in ``relax.models.packed_forward`` sees the sample boundaries), so a sample's logits are its
unpadded logits.

A sample longer than the budget becomes a micro-batch of its own: the budget bounds the packing,
it never drops or truncates a sample (``PackPlan.oversized`` counts them).

The loss never sees the packed row: ``PackedRows.scatter`` puts the per-token log-probs back into the
``[n, T]`` layout of the micro-batch's rows of the padded batch, so the loss, its masks and its
mini-batch-wide denominators are exactly those of the padded path; only the order of the float sums
changes.
"""

from __future__ import annotations

import attrs
import torch

from relax.models.batch import TokenBatch
from relax.models.sampled_distribution import Truncation, entropy_of, sampled_log_softmax


@attrs.frozen
class PackPlan:
    groups: tuple[tuple[int, ...], ...]  # the mini-batch rows of each micro-batch
    lengths: tuple[int, ...]  # real tokens of each row of the mini-batch
    oversized: int  # samples longer than the budget (each a micro-batch of its own)

    @property
    def packed_tokens(self) -> int:
        return sum(self.lengths)


def sample_lengths(batch: TokenBatch) -> list[int]:
    """Real tokens (prompt + response, the environment's turns included) of each row."""
    return batch.attention_mask.sum(dim=1).tolist()


def plan_micro_batches(lengths: list[int], budget: int) -> PackPlan:
    """First-fit decreasing over ``lengths`` with bins of ``budget`` tokens. Deterministic: ties in
    length keep the row order, and rows inside a micro-batch are in ascending row order."""
    if budget < 1:
        raise ValueError(f"--max-tokens-per-micro-batch must be >= 1, got {budget}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    room: list[int] = []
    oversized = 0
    for i in order:
        n = lengths[i]
        if n > budget:
            oversized += 1
            bins.append([i])
            room.append(0)
            continue
        for b, free in enumerate(room):
            if n <= free:
                bins[b].append(i)
                room[b] -= n
                break
        else:
            bins.append([i])
            room.append(budget - n)
    return PackPlan(groups=tuple(tuple(sorted(b)) for b in bins), lengths=tuple(lengths), oversized=oversized)


@attrs.frozen
class PackedRows:
    """One micro-batch as a single row: ``input_ids`` / ``position_ids`` ``[1, L]``, ``cu_seqlens``
    ``[n + 1]`` (sample boundaries in the row), and where each scored response token's logits are."""

    rows: torch.Tensor  # [n] int64: the mini-batch rows, in packed order
    input_ids: torch.Tensor  # [1, L]
    position_ids: torch.Tensor  # [1, L]
    cu_seqlens: torch.Tensor  # [n + 1] int64
    score_at: torch.Tensor  # [K] packed position whose logits score a response token
    targets: torch.Tensor  # [K] the response token ids
    scatter_row: torch.Tensor  # [K] row within the micro-batch
    scatter_col: torch.Tensor  # [K] response column
    shape: tuple[int, int]  # (n, T): the padded layout the loss reads

    @classmethod
    def build(cls, batch: TokenBatch, rows: torch.Tensor) -> PackedRows:
        """Pack ``rows`` of ``batch``. Response token ``t`` of a row is scored, as in the padded path,
        by the logits of the real token just before it (``response_mask`` tokens only: the rest of the
        padded layout is zero there)."""
        sub = batch.select(rows)
        attended = sub.attention_mask
        lengths = attended.sum(dim=1)
        cu = torch.zeros(len(sub) + 1, dtype=torch.long, device=attended.device)
        cu[1:] = lengths.cumsum(0)
        input_ids = sub.input_ids[attended].unsqueeze(0)
        position_ids = torch.cat([torch.arange(int(n), device=attended.device) for n in lengths]).unsqueeze(0)
        # rank[i, c]: 1-based index of column c among row i's real tokens
        rank = attended.long().cumsum(dim=1)
        p = sub.prompt_width
        row, col = sub.response_mask.nonzero(as_tuple=True)
        score_at = cu[row] + rank[row, p + col] - 2  # the real token before it, in the packed row
        return cls(rows=rows, input_ids=input_ids, position_ids=position_ids, cu_seqlens=cu,
                   score_at=score_at, targets=sub.response_ids[row, col], scatter_row=row, scatter_col=col,
                   shape=tuple(sub.response_ids.shape))

    def scatter(self, values: torch.Tensor) -> torch.Tensor:
        """``[K, ...]`` per scored token -> ``[n, T, ...]`` (zero elsewhere), keeping autograd."""
        out = values.new_zeros(tuple(self.shape) + tuple(values.shape[1:]))
        return out.index_put((self.scatter_row, self.scatter_col), values)


def response_log_probs_packed(logits: torch.Tensor, packed: PackedRows, *, with_entropy: bool,
                              temperature: float = 1.0, truncation: Truncation | None = None,
                              with_distribution: bool = False):
    """``([n, T] log-probs, [n, T] entropy or None, [n, T, V] distribution or None)`` from the logits
    ``[K, V]`` at the scored positions (``relax.models.packed_forward.packed_logits``), computed like
    ``relax.models.batch.response_log_probs`` (float32 log-softmax)."""
    scores = logits.float()
    if temperature != 1.0:
        scores = scores / temperature
    log_probs_all = sampled_log_softmax(scores, truncation, packed.targets)
    log_probs = packed.scatter(log_probs_all.gather(-1, packed.targets.unsqueeze(-1)).squeeze(-1))
    entropy = None
    if with_entropy:
        entropy = packed.scatter(entropy_of(log_probs_all))
    distribution = packed.scatter(log_probs_all) if with_distribution else None
    return log_probs, entropy, distribution
