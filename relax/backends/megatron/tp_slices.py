"""A rank's tensor-parallel part of a whole Megatron tensor, and the whole tensor back from the parts.

Which dimension each sharded weight is split along (``SHARD_DIM``; a weight not listed is replicated on
every tensor rank), and the two layouts a contiguous chunk would get wrong: the fused ``linear_qkv``
(whole query groups per rank) and the gated ``linear_fc1`` (each rank holds its gate rows and its up rows).
"""

from __future__ import annotations

import torch

# Dim split across tp ranks (None: replicated). linear_fc1 and linear_qkv need care, see below.
SHARD_DIM = {
    "word_embeddings.weight": 0,
    "output_layer.weight": 0,
    "linear_qkv.weight": 0,
    "linear_qkv.bias": 0,
    "linear_fc1.weight": 0,
    "linear_proj.weight": 1,
    "linear_fc2.weight": 1,
}


def tp_slice(name: str, tensor: torch.Tensor, *, tp_rank: int, tp_size: int) -> torch.Tensor:
    """This rank's part of a whole Megatron tensor.

    - ``linear_qkv``: query groups are whole on a rank, so a contiguous chunk of the per-group
      layout is exactly the rank's groups (tp must divide num_query_groups);
    - gated ``linear_fc1`` = ``[gate; up]``: each rank holds ``[gate_r; up_r]``, NOT a contiguous
      chunk of the whole tensor;
    - everything else: a contiguous chunk along the split dim, or the whole tensor if replicated.
    """
    if tp_size == 1:
        return tensor
    if name.endswith("linear_fc1.weight"):
        gate, up = tensor.chunk(2, dim=0)
        return torch.cat([gate.chunk(tp_size, dim=0)[tp_rank], up.chunk(tp_size, dim=0)[tp_rank]])
    for suffix, dim in SHARD_DIM.items():
        if name.endswith(suffix):
            return tensor.chunk(tp_size, dim=dim)[tp_rank]
    return tensor


def tp_unslice(name: str, parts: list[torch.Tensor]) -> torch.Tensor:
    """Inverse of ``tp_slice``: the whole tensor from every rank's part (in tp-rank order)."""
    if len(parts) == 1:
        return parts[0]
    if name.endswith("linear_fc1.weight"):
        gates, ups = zip(*(p.chunk(2, dim=0) for p in parts))
        return torch.cat([*gates, *ups])
    for suffix, dim in SHARD_DIM.items():
        if name.endswith(suffix):
            return torch.cat(parts, dim=dim)
    return parts[0]
