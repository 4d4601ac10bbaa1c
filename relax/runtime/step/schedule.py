"""How one step's kept prompt groups are split into optimizer mini-batches and data-parallel shards.

A pure function of what the rollout reports, computed by every role from the same report,
so that the advantages deployment (whole batch, ``segment_sizes``) and the actor ranks (their
shards) agree on the layout without talking to each other.
"""

from __future__ import annotations

import attrs
import torch


def _split(items: list, parts: int) -> list[list]:
    """``items`` in ``parts`` contiguous chunks whose sizes differ by at most one (larger first)."""
    base, extra = divmod(len(items), parts)
    out, start = [], 0
    for i in range(parts):
        stop = start + base + (1 if i < extra else 0)
        out.append(items[start:stop])
        start = stop
    return out


@attrs.frozen
class StepPlan:
    group_size: int
    minibatches: tuple[tuple[int, ...], ...]  # group uids of each mini-batch, in order
    shards: tuple[tuple[tuple[int, ...], ...], ...]  # [rank][mini-batch] -> group uids
    global_tokens: tuple[int, ...]  # valid response tokens per mini-batch (all ranks)
    # sequences with a valid token per mini-batch, when some have none (--overlong-filter); None: all
    sequences: tuple[int, ...] | None = None

    @property
    def num_groups(self) -> int:
        return sum(len(mb) for mb in self.minibatches)

    @property
    def segment_sizes(self) -> tuple[int, ...]:
        """Samples per mini-batch of the whole step (for the advantages deployment)."""
        return tuple(len(mb) * self.group_size for mb in self.minibatches)

    @property
    def global_sequences(self) -> tuple[int, ...]:
        return self.sequences if self.sequences is not None else self.segment_sizes

    @property
    def uids(self) -> list[int]:
        """Every group of the step, in mini-batch order (the order the advantages see them)."""
        return [u for mb in self.minibatches for u in mb]

    def rank_uids(self, rank: int) -> list[int]:
        return [u for mb in self.shards[rank] for u in mb]

    def rank_segment_sizes(self, rank: int) -> tuple[int, ...]:
        """Samples of each mini-batch held by ``rank`` (may contain zeros)."""
        return tuple(len(mb) * self.group_size for mb in self.shards[rank])


def plan_step(
    kept_uids: list[int], group_tokens: list[int], group_size: int, num_minibatches: int, world_size: int,
    group_sequences: list[int] | None = None,
) -> StepPlan:
    """Split the kept groups (in write order) into at most ``num_minibatches`` contiguous
    mini-batches of whole groups, then each mini-batch into ``world_size`` contiguous shards.

    Fewer kept groups than ``num_minibatches`` gives fewer (non-empty) mini-batches; a rank whose
    shard of a mini-batch is empty still takes part in that optimizer step (with zero gradient).
    ``group_sequences``: per kept group, its samples with a valid loss token (the loss's sequence
    count); None: every sample counts.
    """
    if num_minibatches < 1 or world_size < 1:
        raise ValueError(f"num_minibatches ({num_minibatches}) and world_size ({world_size}) must be >= 1")
    if len(group_tokens) != len(kept_uids):
        raise ValueError("group_tokens needs one entry per kept group")
    tokens = dict(zip(kept_uids, group_tokens))
    minibatches = [mb for mb in _split(list(kept_uids), num_minibatches) if mb]
    shards = [[] for _ in range(world_size)]
    for mb in minibatches:
        for rank, part in enumerate(_split(mb, world_size)):
            shards[rank].append(tuple(part))
    return StepPlan(
        group_size=group_size,
        minibatches=tuple(tuple(mb) for mb in minibatches),
        shards=tuple(tuple(s) for s in shards),
        global_tokens=tuple(sum(tokens[u] for u in mb) for mb in minibatches),
        sequences=None if group_sequences is None else tuple(
            sum(dict(zip(kept_uids, group_sequences))[u] for u in mb) for mb in minibatches),
    )


def segment_slices(sizes) -> list[slice]:
    """Consecutive row ranges of segments with the given sizes."""
    out, start = [], 0
    for size in sizes:
        out.append(slice(start, start + size))
        start += size
    return out


def staleness_metrics(step: int, versions: torch.Tensor, bound: int) -> dict[str, float]:
    """How many policy versions the samples trained at ``step`` lag behind the policy they update (the
    one after step ``step - 1``), checked against ``bound``: a violation is a scheduling bug."""
    lag = (step - 1) - versions.long()
    if lag.numel() and int(lag.max()) > bound:
        raise RuntimeError(
            f"step {step}: a sample of policy version {int(versions.min())} is {int(lag.max())} versions old, "
            f"beyond --max-staleness {bound}"
        )
    lag = lag.double()
    return {"async/staleness_mean": float(lag.mean()) if lag.numel() else 0.0,
            "async/staleness_max": float(lag.max()) if lag.numel() else 0.0}
