"""Group statistics over arbitrary ``group_ids``.

Vectorized scatter reductions, no Python loop over groups; ids need not be contiguous, sorted or
small.
"""

from __future__ import annotations

import torch

from relax.algorithms.numerics.checks import check_group_ids

# Group ids in [0, DENSE_ID_FACTOR * N + DENSE_ID_SLACK) are used directly as scatter indices
# (O(N)); anything else is compacted with torch.unique (a sort, O(N log N)).
_DENSE_ID_FACTOR = 4
_DENSE_ID_SLACK = 1024
# group_standardize of [N, K] goes column by column (1-D kernels) from this many samples on; below
# it, the per-column Python overhead costs more than the faster kernels save (measured on CPU).
_COLUMNWISE_MIN_SAMPLES = 32768


class Groups:
    """Samples partitioned by ``group_ids``; reductions are vectorized scatters over the groups.

    ``index[i]`` is the row of sample i's group in every per-group tensor; ``counts[g]`` its size.
    Ids that are small non-negative ints are used as rows directly (O(N); rows with count 0 are
    unused); any other ids are first compacted with ``torch.unique`` (a sort, O(N log N)).
    """

    def __init__(self, group_ids: torch.Tensor):
        ids = check_group_ids(group_ids, group_ids.shape[0] if isinstance(group_ids, torch.Tensor) else -1)
        n = ids.shape[0]
        if n == 0:
            self.index, self.num_groups = ids, 0
        else:
            lo, hi = (int(v) for v in torch.aminmax(ids))
            if lo >= 0 and hi < _DENSE_ID_FACTOR * n + _DENSE_ID_SLACK:
                self.index, self.num_groups = ids, hi + 1
            else:
                uniq, self.index = torch.unique(ids, return_inverse=True)
                self.num_groups = uniq.shape[0]
        self.counts = torch.bincount(self.index, minlength=self.num_groups)

    @property
    def sizes(self) -> torch.Tensor:
        """Per sample: the size of its group."""
        return self.broadcast(self.counts)

    def broadcast(self, per_group: torch.Tensor) -> torch.Tensor:
        """Per-group values ``[G(, K)]`` -> per sample ``[N(, K)]``."""
        return per_group.index_select(0, self.index)

    def sum(self, x: torch.Tensor) -> torch.Tensor:
        """Per-group sums of ``x`` (``[N]`` or ``[N, K]``) -> ``[G]`` / ``[G, K]`` (dtype of x)."""
        return x.new_zeros((self.num_groups,) + tuple(x.shape[1:])).index_add_(0, self.index, x)

    def _per_row(self, counts: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return counts.to(x.dtype).reshape((-1,) + (1,) * (x.dim() - 1))

    def mean(self, x: torch.Tensor) -> torch.Tensor:
        """Per-group means ``[G(, K)]``; empty rows give 0."""
        return self.sum(x) / self._per_row(self.counts.clamp(min=1), x)

    def std(self, x: torch.Tensor, mean: torch.Tensor | None = None) -> torch.Tensor:
        """Per-group unbiased std, two-pass (mean first). A group of 1 has std 0 (Bessel term clamped)."""
        mean = self.mean(x) if mean is None else mean
        return self.std_from_deviations(x - self.broadcast(mean))

    def std_from_deviations(self, dev: torch.Tensor, scratch: torch.Tensor | None = None) -> torch.Tensor:
        """Unbiased std from per-sample deviations ``x - mean`` (the second pass).

        ``scratch`` (shape of ``dev``) receives the squared deviations instead of a new tensor.
        """
        sq = torch.mul(dev, dev, out=scratch) if scratch is not None else dev * dev
        return (self.sum(sq) / self._per_row((self.counts - 1).clamp(min=1), dev)).sqrt_()

    def first_member(self) -> torch.Tensor:
        """Per group row: the position of its first sample (0 for unused rows)."""
        n = self.index.shape[0]
        positions = torch.arange(n, device=self.index.device)
        # Start every row at n (past every position) and let the rows' own value take part
        # (include_self=True): the minimum of a used row is the same as with include_self=False,
        # but the kernel skips that mode's per-row "first write" bookkeeping (~3x faster on CPU).
        out = torch.full((self.num_groups,), n, dtype=torch.int64, device=self.index.device)
        out.scatter_reduce_(0, self.index, positions, reduce="amin", include_self=True)
        return out.masked_fill_(out == n, 0)

    def _reduce(self, x: torch.Tensor, how: str) -> torch.Tensor:
        out = x.new_zeros((self.num_groups,) + tuple(x.shape[1:]))
        idx = self.index.reshape((-1,) + (1,) * (x.dim() - 1)).expand_as(x)
        return out.scatter_reduce_(0, idx, x, reduce=how, include_self=False)

    def min(self, x: torch.Tensor) -> torch.Tensor:
        return self._reduce(x, "amin")

    def max(self, x: torch.Tensor) -> torch.Tensor:
        return self._reduce(x, "amax")

    def is_constant(self, x: torch.Tensor) -> torch.Tensor:
        """Per sample (and column): is x exactly constant within the sample's group (min == max)?

        Computed as "every member equals one representative member": cheaper than two scatter
        min/max reductions. Which member becomes the representative (duplicate indices in
        ``index_copy_``) does not matter: the answer is the same for any choice.
        """
        rep = x.new_zeros((self.num_groups,) + tuple(x.shape[1:])).index_copy_(0, self.index, x)
        differs = (x != self.broadcast(rep)).to(torch.int32)
        return self.broadcast(torch.zeros_like(rep, dtype=torch.int32).index_add_(0, self.index, differs)) == 0


def group_standardize(
    values: torch.Tensor,
    group_ids: torch.Tensor | Groups,
    eps: float,
    *,
    divide_by_std: bool = True,
) -> torch.Tensor:
    """Per group ``(x - mean) / (std + eps)`` (or ``x - mean``), unbiased two-pass std, dtype of ``values``.

    ``values`` ``[N]`` or ``[N, K]`` (columns standardized independently; use float64 for accuracy).
    A column that is exactly constant within its group gives exact zeros: the statistics are taken
    of ``x - x_first`` (x_first = the group's first member), which is exactly 0 for a constant column,
    and the shift also spares the mean from cancellation when |x| is large compared to its spread.
    Two [N(, K)] buffers are reused in place: on CPU, fresh multi-megabyte allocations cost more
    (page faults) than the arithmetic.
    """
    g = group_ids if isinstance(group_ids, Groups) else Groups(group_ids)
    first = g.first_member()
    out = values.new_empty(values.shape)
    if values.dim() == 1 or values.shape[0] < _COLUMNWISE_MIN_SAMPLES:
        return _standardize_into(out, values, g, first, eps, divide_by_std)
    # Large [N, K]: one column at a time, read from and written to strided column views. The 1-D
    # index_add_/index_select kernels are ~2x faster than the 2-D scatter path, and each column's
    # sums still run over its samples in sample order, so the bits are those of the 2-D reduction.
    # (Transposing to [K, N] and back would cost more than the kernels save.)
    scratch = values.new_empty(values.shape[:1])
    for k in range(values.shape[1]):
        _standardize_into(out[:, k], values[:, k], g, first, eps, divide_by_std, scratch)
    return out


def _standardize_into(
    out: torch.Tensor,
    x: torch.Tensor,
    g: Groups,
    first: torch.Tensor,
    eps: float,
    divide_by_std: bool,
    scratch: torch.Tensor | None = None,
) -> torch.Tensor:
    """``group_standardize`` of ``x`` (``[N]``, any stride, or ``[N, K]``) written into ``out``.

    ``scratch``: a contiguous buffer of x's shape (allocated if None).
    """
    scratch = x.new_empty(x.shape) if scratch is None else scratch
    torch.index_select(x.index_select(0, first), 0, g.index, out=scratch)  # x_first per sample
    torch.sub(x, scratch, out=out)
    out.sub_(torch.index_select(g.mean(out), 0, g.index, out=scratch))
    if divide_by_std:
        std = g.std_from_deviations(out, scratch=scratch)
        out.div_(torch.index_select(std.add_(eps), 0, g.index, out=scratch))
    return out


def group_standardize_unshifted(
    values: torch.Tensor, group_ids: torch.Tensor | Groups, eps: float
) -> torch.Tensor:
    """Per group plain ``(x - mean) / (std + eps)`` with no special case, dtype of ``values``.

    Unlike ``group_standardize`` the statistics are taken of ``x`` itself, so a constant column keeps
    whatever residue ``x - mean(x)`` has after rounding (e.g. three copies of 0.1 in float64 have a
    mean of 0.10000000000000002). Unbiased two-pass std; a group of one has std 0.
    """
    g = group_ids if isinstance(group_ids, Groups) else Groups(group_ids)
    dev = values - g.broadcast(g.mean(values))
    return dev / g.broadcast(g.std_from_deviations(dev).add_(eps))


def leave_one_out_factor(groups: Groups, dtype=torch.float64) -> torch.Tensor:
    """Per sample ``G / (G - 1)``: x_i - mean_{j != i} x_j = G / (G - 1) * (x_i - mean_g) for a group of G.

    Groups of fewer than 2 samples have no leave-one-out baseline -> ``ValueError``.
    """
    sizes = groups.sizes
    if sizes.numel() and int(sizes.min()) < 2:
        i = int((sizes < 2).nonzero()[0])
        raise ValueError(
            f"leave-one-out baseline needs groups of at least 2 samples, but sample {i} is alone in its "
            "group; use --n-samples-per-prompt >= 2 and keep groups whole"
        )
    return sizes.to(dtype) / (sizes - 1).to(dtype)


def group_leave_one_out(values: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """RLOO: ``x_i - mean_{j != i} x_j`` = ``G/(G-1) * (x_i - mean_g)``; every group needs >= 2 samples."""
    g = Groups(group_ids)
    sizes = g.sizes
    if values.shape[0] and int(sizes.min()) < 2:
        i = int((sizes < 2).nonzero()[0])
        raise ValueError(
            f"leave-one-out baseline needs groups of at least 2 samples, but sample {i} (group id "
            f"{int(group_ids[i])}) is alone in its group; use --n-samples-per-prompt >= 2 and keep groups whole"
        )
    scale = sizes.to(values.dtype) / (sizes - 1).to(values.dtype)
    return scale * (values - g.broadcast(g.mean(values)))


def group_has_spread(values: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
    """Per sample: does its group hold at least two different values (exact comparison)?"""
    return ~Groups(group_ids).is_constant(values)
