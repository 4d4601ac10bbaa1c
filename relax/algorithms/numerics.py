"""The shared numerics of every built-in algorithm (pure torch; no algorithm copies any of this).

Sections, in order:

1. input checks (shapes, finiteness) with messages that name the sample and the reward key;
2. group statistics over arbitrary ``group_ids`` (vectorized scatter reductions, no Python loop
   over groups; ids need not be contiguous, sorted or small);
3. batch statistics (two-pass float64 mean / std, whitening, REINFORCE++ token normalization),
   each reduced over an optional ``process_group`` so shards reproduce the single-process numbers;
4. KL estimators, terminal-reward placement, GAE and discounted-return scans over masked ``[N, T]``;
5. loss aggregation and the clipped value loss.

Conventions: statistics that can cancel are computed in float64 with two passes (mean first, then
the sum of squared deviations); results come back in float32 (or the input's floating dtype).
Masked positions never contribute: we select with ``torch.where`` rather than multiplying by the
mask, so a NaN/inf in a padded position cannot leak into a sum (``0 * nan`` is ``nan``).

Distributed rule: every rank reaches every collective. A problem found on one rank (non-finite
input, malformed ``segment_sizes``) is folded into a collective that all ranks run anyway, and then
all ranks raise together; raising before a collective would leave the other ranks waiting forever.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
import torch.distributed as dist

# -- constants (named so that tests and docs can refer to them) --
GRPO_STD_EPS = 1e-6  # GRPO/GSPO/SAPO/CISPO: (r - mean) / (std + GRPO_STD_EPS)
GDPO_EPS = 1e-4  # GDPO steps 1 and 3 (matches the NVlabs/TRL reference `std + 1e-4`)
WHITEN_VAR_EPS = 1e-8  # --normalize-advantages: (x - mean) * rsqrt(var + WHITEN_VAR_EPS)
TOKEN_GLOBAL_VAR_FLOOR = 1e-8  # REINFORCE++: (x - mean) * max(var, floor) ** -1/2
LOW_VAR_KL_CLAMP = 10.0  # low_var_kl is clamped to [-10, 10]
KL_ESTIMATORS = ("k1", "k2", "k3", "low_var_kl")
LOSS_AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum")
OFF_POLICY_CORRECTIONS = ("none", "tis", "decoupled")

# Group ids in [0, DENSE_ID_FACTOR * N + DENSE_ID_SLACK) are used directly as scatter indices
# (O(N)); anything else is compacted with torch.unique (a sort, O(N log N)).
_DENSE_ID_FACTOR = 4
_DENSE_ID_SLACK = 1024
# group_standardize of [N, K] goes column by column (1-D kernels) from this many samples on; below
# it, the per-column Python overhead costs more than the faster kernels save (measured on CPU).
_COLUMNWISE_MIN_SAMPLES = 32768


# ---------------------------------------------------------------------------------------------
# 1. input checks
# ---------------------------------------------------------------------------------------------


def first_non_finite(values: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[int, ...] | None:
    """Index (as a tuple) of the first non-finite element of ``values`` where ``mask`` holds, or None."""
    if not values.is_floating_point() or (values.numel() and bool(torch.isfinite(values.sum()))):
        return None  # a finite total proves every element finite (nan/inf propagate); the common case
    bad = ~torch.isfinite(values)
    if mask is not None:
        bad = bad & mask
    if not bool(bad.any()):
        return None
    return tuple(int(i) for i in bad.nonzero()[0])


def reward_matrix(rewards: torch.Tensor, reward_keys: Sequence[str]) -> torch.Tensor:
    """Check ``rewards`` (``[N]`` or ``[N, K]``, columns in ``reward_keys`` order) -> float64 ``[N, K]``.

    Raises ``ValueError`` naming the sample and the key of the first non-finite value.
    """
    if not isinstance(rewards, torch.Tensor):
        raise TypeError(f"rewards must be a torch.Tensor, got {type(rewards).__name__}")
    if rewards.dim() == 1:
        rewards = rewards[:, None]
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [N] or [N, K], got shape {tuple(rewards.shape)}")
    if rewards.shape[1] != len(reward_keys):
        raise ValueError(
            f"rewards has {rewards.shape[1]} column(s) but reward_keys lists {len(reward_keys)} "
            f"({', '.join(reward_keys)}); pass one column per reward key, in reward_keys order"
        )
    if not (rewards.is_floating_point() or rewards.dtype in (torch.int32, torch.int64)):
        raise TypeError(f"rewards must be a float tensor, got dtype {rewards.dtype}")
    where = first_non_finite(rewards) if rewards.is_floating_point() else None
    if where is not None:
        i, k = where
        n_bad = int((~torch.isfinite(rewards)).sum())
        raise ValueError(
            f"reward {reward_keys[k]!r} of sample {i} is {rewards[i, k].item()!r} ({n_bad} non-finite value(s) "
            "in this batch). Reward functions must return finite numbers; fix the reward function or drop "
            "the sample before normalization."
        )
    return rewards.to(torch.float64)


def weighted_sum(rewards64: torch.Tensor, weights: Sequence[float]) -> torch.Tensor:
    """``[N, K]`` float64 -> ``[N]`` float64: sum_k w_k * r_k."""
    w = torch.tensor(tuple(weights), dtype=torch.float64, device=rewards64.device)
    if rewards64.shape[1] == 1 and float(w[0]) == 1.0:
        return rewards64[:, 0].clone()
    return rewards64 @ w


def check_group_ids(group_ids: torch.Tensor, n: int) -> torch.Tensor:
    """Validate ``group_ids`` (integer ``[N]``) -> int64."""
    if not isinstance(group_ids, torch.Tensor):
        raise TypeError(f"group_ids must be a torch.Tensor, got {type(group_ids).__name__}")
    if group_ids.dim() != 1 or group_ids.shape[0] != n:
        raise ValueError(
            f"group_ids must be a 1-D tensor of {n} ids (one per sample), got shape {tuple(group_ids.shape)}"
        )
    if group_ids.is_floating_point() or group_ids.is_complex() or group_ids.dtype == torch.bool:
        raise TypeError(f"group_ids must be an integer tensor, got dtype {group_ids.dtype}")
    return group_ids.to(torch.int64)


# ---------------------------------------------------------------------------------------------
# 2. group statistics
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# 3. batch statistics, optionally reduced over a process group
# ---------------------------------------------------------------------------------------------


def _all_reduce(t: torch.Tensor, op, process_group) -> torch.Tensor:
    if process_group is not None:
        dist.all_reduce(t, op=op, group=process_group)
    return t


def raise_on_all_ranks(local_message: str | None, process_group, what: str, device=None) -> None:
    """One MAX all-reduce of an error flag; every rank raises ``ValueError`` if any rank had a problem.

    The rank at fault raises its own message; the others say that another rank reported ``what``.
    """
    flag = torch.tensor([1.0 if local_message else 0.0], dtype=torch.float64, device=device)
    _all_reduce(flag, dist.ReduceOp.MAX, process_group)
    if float(flag[0]) > 0:
        raise ValueError(
            local_message or f"another rank in the process group reported {what}; see its error message"
        )


def _non_finite_message(values, mask, what: str) -> str | None:
    where = first_non_finite(values, mask)
    if where is None:
        return None
    pos = f"sample {where[0]}" + (f", token {where[1]}" if len(where) > 1 else "")
    return (
        f"{what} received a non-finite value {values[where].item()!r} at {pos} (on this rank). Check the "
        "rewards / values feeding it; non-finite numbers are never replaced silently."
    )


def check_finite(values: torch.Tensor, mask: torch.Tensor | None = None, process_group=None, *, what: str) -> None:
    """Raise ``ValueError`` on every rank if any rank holds a non-finite (valid) value. One collective."""
    message = _non_finite_message(values, None if mask is None else mask.to(torch.bool), what)
    raise_on_all_ranks(message, process_group, f"a non-finite value for {what}", device=values.device)


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


def all_gather_rows(
    local: torch.Tensor, process_group=None, *, error: str | None = None, what: str = "all_gather_rows"
) -> tuple[torch.Tensor, int]:
    """Concatenate every rank's ``[n_r]`` or ``[n_r, t_r]`` tensor along dim 0, in rank order.

    -> ``(whole, offset)`` with ``whole[offset:offset + n]`` this rank's rows. 2-D pieces of different
    widths are right-padded with zeros to the widest. ``error`` (a message found on this rank) is
    agreed on in the first collective and raised on every rank. Without a group: ``(local, 0)``.
    """
    if process_group is None:
        if error:
            raise ValueError(error)
        return local, 0
    world, rank = dist.get_world_size(process_group), dist.get_rank(process_group)
    width = local.shape[1] if local.dim() == 2 else 0
    shapes = torch.zeros(world, 3, dtype=torch.int64, device=local.device)
    shapes[rank] = torch.tensor([local.shape[0], width, 1 if error else 0])
    _all_reduce(shapes, dist.ReduceOp.SUM, process_group)
    if int(shapes[:, 2].max()):
        raise ValueError(error or f"another rank in the process group reported a problem with {what}; "
                         "see its error message")
    rows, t_max = int(shapes[:, 0].max()), int(shapes[:, 1].max())
    padded = local.new_zeros((rows, t_max) if local.dim() == 2 else (rows,))
    if local.dim() == 2:
        padded[: local.shape[0], : local.shape[1]] = local
    else:
        padded[: local.shape[0]] = local
    pieces = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(pieces, padded, group=process_group)
    whole = torch.cat([p[: int(shapes[r, 0])] for r, p in enumerate(pieces)])
    return whole, int(shapes[:rank, 0].sum())


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


# ---------------------------------------------------------------------------------------------
# 4. KL estimators and return / advantage scans
# ---------------------------------------------------------------------------------------------


def kl_estimate(log_probs: torch.Tensor, base_log_probs: torch.Tensor, kind: str = "k1") -> torch.Tensor:
    """Per-token estimate of KL(current || base) from log-probs of the sampled tokens.

    With d = log_probs - base_log_probs: k1 = d; k2 = d^2 / 2; k3 = exp(-d) - 1 + d;
    low_var_kl = k3 clamped to [-10, 10].
    """
    d = log_probs - base_log_probs
    if kind == "k1":
        return d
    if kind == "k2":
        return 0.5 * d * d
    if kind in ("k3", "low_var_kl"):
        k3 = torch.expm1(-d) + d
        return k3.clamp(-LOW_VAR_KL_CLAMP, LOW_VAR_KL_CLAMP) if kind == "low_var_kl" else k3
    raise ValueError(f"unknown KL estimator {kind!r}; choose one of {', '.join(KL_ESTIMATORS)} (--kl-loss-type)")


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
        r = r - kl_coef * torch.where(mask, kl.to(torch.float64), torch.zeros((), dtype=torch.float64))
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


# ---------------------------------------------------------------------------------------------
# 5. loss aggregation and value loss
# ---------------------------------------------------------------------------------------------


def aggregate(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token_mean",
    *,
    global_num_tokens: float | None = None,
    global_num_sequences: float | None = None,
) -> torch.Tensor:
    """Reduce a ``[N, T]`` per-token quantity to a scalar; masked positions never contribute.

    - ``token_mean``: sum over valid tokens / number of valid tokens (or ``global_num_tokens``);
    - ``seq_mean_token_mean``: mean over sequences of each sequence's token mean;
    - ``seq_mean_token_sum``: mean over sequences of each sequence's token sum (Dr.GRPO-style).

    "Sequences" are those with at least one valid token; ``global_num_sequences`` replaces their local
    count as the divisor (so micro-batch losses add up to the mini-batch loss).
    """
    mask = mask.to(torch.bool)
    x = torch.where(mask, per_token, torch.zeros((), dtype=per_token.dtype, device=per_token.device))
    if mode == "token_mean":
        denom = global_num_tokens if global_num_tokens is not None else mask.sum().clamp(min=1)
        return x.sum() / denom
    tokens_per_seq = mask.sum(dim=1)
    seq_sum = x.sum(dim=1)
    if mode == "seq_mean_token_mean":
        per_seq = seq_sum / tokens_per_seq.clamp(min=1)
    elif mode == "seq_mean_token_sum":
        per_seq = seq_sum
    else:
        raise ValueError(f"unknown loss_aggregation {mode!r}; choose one of {', '.join(LOSS_AGGREGATIONS)}")
    if global_num_sequences is not None:
        denom = global_num_sequences
    else:
        denom = (tokens_per_seq > 0).sum().clamp(min=1)
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


def behaviour_weights(
    proximal_log_probs: torch.Tensor, behaviour_log_probs: torch.Tensor, mode: str, cap: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token weights that correct a loss for samples drawn by a behaviour policy -> ``(weight, capped)``.

    ``proximal_log_probs`` are the trainer's log-probs before this step's updates (``old_log_probs``:
    PPO's ratio is taken against them), ``behaviour_log_probs`` the rollout's sampling log-probs,
    possibly of an older policy version. With ``w = exp(proximal - behaviour)``:

    - ``tis``: truncated importance sampling, ``min(w, cap)``;
    - ``decoupled``: the decoupled PPO objective, ``w`` itself, and tokens with ``w > cap`` get
      weight 0 (they are dropped rather than down-weighted).

    The weights carry no gradient. ``capped`` marks the tokens whose weight hit the cap.
    """
    if mode not in OFF_POLICY_CORRECTIONS or mode == "none":
        raise ValueError(f"mode must be one of {OFF_POLICY_CORRECTIONS[1:]}, got {mode!r}")
    weight = torch.exp((proximal_log_probs - behaviour_log_probs).detach())
    capped = weight > cap
    if mode == "tis":
        return weight.clamp(max=cap), capped
    return torch.where(capped, torch.zeros_like(weight), weight), capped


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
