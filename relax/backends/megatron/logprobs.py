"""Per-token log-probs and entropy from vocab-parallel logits (each tp rank holds ``V/tp`` columns).

Neither function gathers the full vocabulary: the softmax normalizer and the entropy sums are
all-reduced over the tensor-parallel group, and gradients flow back to each rank's shard.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def vocab_parallel_log_probs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``log softmax(logits)[targets]`` for logits ``[..., V/tp]`` sharded over the tp group."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    if parallel_state.get_tensor_model_parallel_world_size() == 1:
        # The whole vocabulary is local: skip the three (no-op) all-reduces and the defensive copy.
        return torch.log_softmax(logits.float(), dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    # vocab_parallel_cross_entropy subtracts the max from its input *in place*: never hand it
    # logits that are used again (entropy, or a reference comparison).
    return -vocab_parallel_cross_entropy(logits.clone(), targets)


def vocab_parallel_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of ``softmax(logits)`` over the whole (sharded) vocabulary, differentiable."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

    group = parallel_state.get_tensor_model_parallel_group()
    logits = logits.float()
    # The max only stabilizes exp(); it cancels in the result, so no gradient goes through it.
    row_max = logits.detach().amax(dim=-1, keepdim=True)
    if dist.get_world_size(group) > 1:
        dist.all_reduce(row_max, op=dist.ReduceOp.MAX, group=group)
    shifted = logits - row_max
    exp = shifted.exp()
    # reduce_from_tensor_model_parallel_region: all-reduce sum forward, identity backward.
    sum_exp = reduce_from_tensor_model_parallel_region(exp.sum(dim=-1))
    sum_exp_shifted = reduce_from_tensor_model_parallel_region((exp * shifted).sum(dim=-1))
    # H = log Z - E_p[shifted logit]
    return sum_exp.log() - sum_exp_shifted / sum_exp
