"""Advantages on the training ranks (``--advantages-on-actor``) instead of the Ray Serve deployment.

Each data-parallel rank holds a shard of every optimizer mini-batch. It calls the algorithm's
``compute_advantages`` on its shard with ``segment_sizes`` = the sizes of *its pieces* of the
mini-batches and ``process_group`` = the data-parallel group, so batch statistics are pooled over
the ranks and every rank gets exactly the numbers one process computes on the whole batch.
Tensor/pipeline peers of a DP rank hold the same shard and sit in different DP groups, so they
compute the same numbers independently (no extra communication).

Nothing here imports megatron-core: it works with any backend that exposes its DP group.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from relax.algorithms.types import AdvantageInputs


def shard_minibatches(segment_sizes: Sequence[int], dp_size: int) -> list[tuple[list[int], tuple[int, ...]]]:
    """Split each mini-batch (consecutive rows, in order) over ``dp_size`` ranks as evenly as possible.

    Returns, per rank, ``(row indices into the whole batch, this rank's segment sizes)``. A rank may
    get 0 rows of a small mini-batch; the segment is still listed (size 0) so that every rank sees
    the same number of segments, as the collective statistics require.
    """
    if dp_size < 1:
        raise ValueError(f"dp_size must be >= 1, got {dp_size}")
    shards: list[tuple[list[int], list[int]]] = [([], []) for _ in range(dp_size)]
    start = 0
    for size in segment_sizes:
        base, extra = divmod(size, dp_size)
        for rank in range(dp_size):
            n = base + (1 if rank < extra else 0)
            shards[rank][0].extend(range(start, start + n))
            shards[rank][1].append(n)
            start += n
    return [(rows, tuple(sizes)) for rows, sizes in shards]


def compute_advantages_on_actor(
    algorithm,
    *,
    rewards: torch.Tensor,
    response_mask: torch.Tensor,
    segment_sizes: Sequence[int],
    process_group,
    values: torch.Tensor | None = None,
    kl: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """This DP rank's ``(advantages, returns)`` for its shard.

    ``rewards`` ``[n]`` (the output of ``normalize_rewards``), ``response_mask`` ``[n, T]`` and the
    optional ``values``/``kl`` are this rank's rows; ``segment_sizes`` the sizes of its pieces of the
    optimizer mini-batches, in order; ``process_group`` the data-parallel group (e.g.
    ``MegatronBackend.dp_group``; None for a single rank). Every DP rank must call this together.
    """
    inputs = AdvantageInputs(
        rewards=rewards,
        response_mask=response_mask,
        values=values,
        kl=kl,
        segment_sizes=tuple(int(s) for s in segment_sizes),
    )
    return algorithm.compute_advantages(inputs, process_group=process_group)
