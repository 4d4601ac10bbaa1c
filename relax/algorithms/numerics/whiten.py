"""Batch statistics: sample-level whitening per segment and token-level normalization.

Two-pass float64 mean / std, each reduced over an optional ``process_group`` so shards reproduce
the single-process numbers.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
import torch.distributed as dist

from relax.algorithms.numerics.collective import _all_reduce, _non_finite_message
from relax.algorithms.numerics.constants import GDPO_EPS, TOKEN_GLOBAL_VAR_FLOOR, WHITEN_VAR_EPS


def _check_segments(segment_sizes, n: int) -> tuple[tuple[int, ...], str | None]:
    if segment_sizes is None:
        return (n,), None
    sizes = tuple(segment_sizes)
    if not sizes or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in sizes):
        return (), f"segment_sizes must be a non-empty sequence of non-negative ints, got {segment_sizes!r}"
    if sum(sizes) != n:
        return (), f"segment_sizes {sizes} sum to {sum(sizes)}, but this rank holds {n} samples"
    return sizes, None


def whiten_segments(
    values: torch.Tensor,
    segment_sizes: Sequence[int] | None = None,
    process_group=None,
    *,
    eps: float = GDPO_EPS,
    what: str = "batch whitening",
) -> torch.Tensor:
    """Sample-level whitening ``(x - mean) / (std + eps)`` of ``values`` ``[N]`` per segment.

    ``segment_sizes`` splits the samples (in order) into consecutive segments, e.g. the optimizer
    mini-batches; None = one segment. Statistics are two-pass float64 with unbiased std, reduced over
    ``process_group`` (rank r's segment s is pooled with every other rank's segment s). A segment
    whose values are all exactly equal across the group (or that is empty) gives exact zeros.

    Errors, raised on every rank: malformed ``segment_sizes``, a different number of segments on
    different ranks, non-finite values. Collectives: 1 (agreement) + 3 (stats), independent of the
    number of segments.
    """
    if values.dim() != 1:
        raise ValueError(f"{what} expects per-sample values [N], got shape {tuple(values.shape)}")
    n, device = values.shape[0], values.device
    sizes, error = _check_segments(segment_sizes, n)
    error = error or _non_finite_message(values, None, what)
    _agree_on_segments(sizes, error, process_group, device,
                       problems=f"malformed segment_sizes or a non-finite value for {what}")
    segments = _Segments(sizes, device)
    x = segments.shape(values.to(torch.float64))
    count = torch.tensor(sizes, dtype=torch.float64, device=device)
    first = torch.stack([count, segments.sum(x)], dim=1)
    _all_reduce(first, dist.ReduceOp.SUM, process_group)
    count = first[:, 0]
    dev = x - segments.spread(first[:, 1] / count.clamp(min=1))
    ss = segments.sum(dev * dev)
    _all_reduce(ss, dist.ReduceOp.SUM, process_group)
    std = (ss / (count - 1).clamp(min=1)).sqrt_()
    # Representative = the segment's first sample on this rank (none on an empty shard).
    starts = torch.tensor((0,) + tuple(itertools.accumulate(sizes))[:-1], dtype=torch.int64, device=device)
    flat = x.reshape(-1)
    rep = flat.index_select(0, starts.clamp(max=n - 1)) if n else torch.zeros(len(sizes), **_f64(device))
    differs = segments.any(x != segments.spread(rep))
    # Only compared across ranks: without a process group the bookkeeping is skipped.
    has_rep = None if process_group is None else torch.tensor([s > 0 for s in sizes], device=device)
    collapsed = _segments_collapsed(rep, has_rep, differs, count == 0, process_group)
    return _scale(dev, std, eps, collapsed, segments, values)


def whiten_segments_weighted(
    values: torch.Tensor,
    weights: torch.Tensor,
    segment_sizes: Sequence[int] | None = None,
    process_group=None,
    *,
    eps: float = GDPO_EPS,
    what: str = "batch whitening",
) -> torch.Tensor:
    """``whiten_segments`` with per-sample weights (e.g. response-token counts) in the statistics.

    Per segment: mean = sum(w x) / sum(w), std = sqrt(sum(w (x - mean)^2) / (sum(w) - 1)) (the
    unbiased std of the values repeated w times: with token counts, the std over valid tokens), and
    ``(x - mean) / (std + eps)`` per sample. Samples with weight 0 do not enter the statistics. A
    segment whose positive-weight samples are all equal across the group, or whose weights sum to 0,
    gives exact zeros. Errors and collectives as in ``whiten_segments`` (weights must be finite, >= 0).
    """
    if values.dim() != 1 or weights.shape != values.shape:
        raise ValueError(
            f"{what} expects per-sample values and weights [N], got shapes {tuple(values.shape)} and "
            f"{tuple(weights.shape)}"
        )
    n, device = values.shape[0], values.device
    w = weights.to(torch.float64)
    sizes, error = _check_segments(segment_sizes, n)
    error = error or _non_finite_message(values, None, what)
    if error is None and n and not bool((torch.isfinite(w) & (w >= 0)).all()):
        error = f"{what}: weights must be finite and >= 0"
    _agree_on_segments(sizes, error, process_group, device,
                       problems=f"malformed segment_sizes, weights or a non-finite value for {what}")
    segments = _Segments(sizes, device)
    x, w = segments.shape(values.to(torch.float64)), segments.shape(w)
    first = torch.stack([segments.sum(w), segments.sum(w * x)], dim=1)
    _all_reduce(first, dist.ReduceOp.SUM, process_group)
    total = first[:, 0]
    dev = x - segments.spread(first[:, 1] / torch.where(total > 0, total, torch.ones_like(total)))
    ss = segments.sum(w * dev * dev)
    _all_reduce(ss, dist.ReduceOp.SUM, process_group)
    std = (ss / (total - 1).clamp(min=1)).sqrt_()
    # Only positive-weight samples count for the collapse test: representative = the segment's first
    # such sample on this rank.
    positive = w > 0
    big = torch.iinfo(torch.int64).max
    pos = torch.arange(n, device=device)
    first_pos = torch.full((len(sizes),), big, dtype=torch.int64, device=device)
    seg_index = torch.repeat_interleave(torch.arange(len(sizes), device=device),
                                        torch.tensor(sizes, dtype=torch.int64, device=device))
    first_pos.scatter_reduce_(0, seg_index, torch.where(positive.reshape(-1), pos, big), reduce="amin")
    has_rep = first_pos < big
    rep = x.reshape(-1).index_select(0, torch.where(has_rep, first_pos, 0)) if n else \
        torch.zeros(len(sizes), **_f64(device))
    differs = segments.any((x != segments.spread(rep)) & positive)
    collapsed = _segments_collapsed(rep, has_rep, differs, total == 0, process_group)
    return _scale(dev, std, eps, collapsed, segments, values)


def _agree_on_segments(sizes, error: str | None, process_group, device, *, problems: str) -> None:
    """Raise on every rank if any rank found ``error`` or the ranks split into different numbers of
    segments. One MAX all-reduce of ``[-S, S, bad]``; a failed rank contributes 0 segments, neutral
    for MAX. ``problems`` completes "another rank in the process group reported ..." on the others.
    """
    if process_group is None:
        if error:
            raise ValueError(error)
        return
    s_local = 0 if error else len(sizes)
    agree = torch.tensor([-s_local, s_local, 1 if error else 0], dtype=torch.int64, device=device)
    _all_reduce(agree, dist.ReduceOp.MAX, process_group)
    if int(agree[2]):
        raise ValueError(
            error or f"another rank in the process group reported {problems}; see its error message"
        )
    low, high = -int(agree[0]), int(agree[1])
    if low != high:
        raise ValueError(
            f"segment_sizes describes {len(sizes)} segment(s) on this rank, but ranks in the process group "
            f"report between {low} and {high}; every rank must split its shard into the same number of "
            "mini-batches"
        )


def _segments_collapsed(rep, has_rep, differs, empty, process_group) -> torch.Tensor:
    """Per segment: are all its counted values exactly equal across the process group (or none)?

    An exact global min == max test without two scatter reductions: a segment is collapsed iff on
    every rank its values all equal that rank's representative ``rep`` (``differs`` false), and the
    representatives agree across ranks. One MAX all-reduce of ``[-rep, rep, differs]``; a rank
    without a representative (``has_rep`` false; only read with a process group) sends -inf.
    ``empty``: no counted value anywhere.
    """
    if process_group is None:
        return empty | ~differs  # alone: no other rank's representatives to compare
    minus_inf = torch.full_like(rep, float("-inf"))
    ext = torch.stack([torch.where(has_rep, -rep, minus_inf), torch.where(has_rep, rep, minus_inf),
                       differs.to(torch.float64)], dim=1)
    _all_reduce(ext, dist.ReduceOp.MAX, process_group)
    return empty | ((ext[:, 2] == 0) & (-ext[:, 0] == ext[:, 1]))


def _scale(dev, std, eps: float, collapsed, segments: _Segments, values: torch.Tensor) -> torch.Tensor:
    """``dev / (std + eps)`` per segment, exact zeros in collapsed segments, flat in ``values``' dtype."""
    out = dev.div_(segments.spread(std.add_(eps))).masked_fill_(segments.spread(collapsed), 0.0)
    return out.reshape(-1).to(values.dtype if values.is_floating_point() else torch.float32)


def _f64(device) -> dict:
    return {"dtype": torch.float64, "device": device}


class _Segments:
    """Consecutive segments of given sizes: per-segment sums and per-sample spreading.

    Equal, non-zero sizes (the usual case: equal mini-batches) work on an ``[S, L]`` view with
    broadcasting (no per-sample copies of the statistics); other sizes use index_add / index_select
    on the flat ``[N]`` values. ``shape`` puts values into the layout the other methods expect.
    """

    def __init__(self, sizes: tuple[int, ...], device):
        self.n_seg = len(sizes)
        self.equal = len(set(sizes)) == 1 and sizes[0] > 0
        self.length = sizes[0]
        if not self.equal:
            self.index = torch.repeat_interleave(
                torch.arange(self.n_seg, device=device), torch.tensor(sizes, dtype=torch.int64, device=device)
            )

    def shape(self, v: torch.Tensor) -> torch.Tensor:
        return v.view(self.n_seg, self.length) if self.equal else v

    def sum(self, v: torch.Tensor) -> torch.Tensor:
        if self.equal:
            return v.sum(dim=1)
        return v.new_zeros(self.n_seg).index_add_(0, self.index, v)

    def spread(self, per_segment: torch.Tensor) -> torch.Tensor:
        return per_segment[:, None] if self.equal else per_segment.index_select(0, self.index)

    def any(self, flags: torch.Tensor) -> torch.Tensor:
        """Per segment: is any of the (bool) ``flags`` set? (Empty segments: False.)"""
        if self.equal:
            return flags.any(dim=1)
        return flags.new_zeros(self.n_seg, dtype=torch.int32).index_add_(0, self.index, flags.to(torch.int32)) > 0


def masked_whiten(
    values: torch.Tensor,
    mask: torch.Tensor,
    process_group=None,
    *,
    eps: float = WHITEN_VAR_EPS,
    what: str = "advantage whitening (normalize_advantages)",
) -> torch.Tensor:
    """Token-level whitening over the valid tokens of the whole (sharded) batch.

    ``(x - mean) * rsqrt(var + eps)`` with unbiased var, two-pass float64; zeros where ``mask`` is
    false. No valid token anywhere, or a non-finite valid value -> ``ValueError`` on every rank.
    """
    return _normalize_tokens(values, mask, process_group, unbiased=True, what=what,
                             scale=lambda var: (var + eps).rsqrt())


def token_global_normalize(
    values: torch.Tensor,
    mask: torch.Tensor,
    process_group=None,
    *,
    what: str = "REINFORCE++ token normalization",
) -> torch.Tensor:
    """REINFORCE++ global token normalization: population moments over all valid tokens.

    ``(x - mean) * max(var, 1e-8) ** -1/2`` with var = sum((x - mean)^2) / count (ddof 0), two-pass
    float64; zeros where ``mask`` is false; errors as in ``masked_whiten``.
    """
    return _normalize_tokens(values, mask, process_group, unbiased=False, what=what,
                             scale=lambda var: var.clamp(min=TOKEN_GLOBAL_VAR_FLOOR).rsqrt())


def _normalize_tokens(values, mask, process_group, *, unbiased, what, scale):
    if values.shape != mask.shape:
        raise ValueError(f"{what}: values {tuple(values.shape)} and mask {tuple(mask.shape)} differ in shape")
    mask = mask.to(torch.bool)
    x = values.to(torch.float64)
    zero = torch.zeros((), dtype=torch.float64, device=x.device)
    error = _non_finite_message(values, mask, what)
    # First collective carries the error flag along with [count, sum]: no extra round trip.
    first = torch.stack([
        mask.sum().to(torch.float64),
        torch.where(mask & torch.isfinite(x), x, zero).sum(),
        torch.tensor(1.0 if error else 0.0, dtype=torch.float64, device=x.device),
    ])
    _all_reduce(first, dist.ReduceOp.SUM, process_group)
    if float(first[2]) > 0:
        raise ValueError(error or f"another rank in the process group reported a non-finite value for {what}")
    count = first[0]
    if float(count) == 0:
        raise ValueError(f"{what}: there is no valid response token in the whole batch (on any rank)")
    mean = first[1] / count
    ss = torch.where(mask, (x - mean) ** 2, zero).sum()
    _all_reduce(ss, dist.ReduceOp.SUM, process_group)
    var = ss / ((count - 1).clamp(min=1) if unbiased else count)
    out = torch.where(mask, (x - mean) * scale(var), zero)
    return out.to(values.dtype if values.is_floating_point() else torch.float32)
