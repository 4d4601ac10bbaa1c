"""Per-token log-probs and entropy from vocab-parallel logits (each tp rank holds ``V/tp`` columns).

Neither function gathers the full vocabulary: the softmax normalizer and the entropy sums are
all-reduced over the tensor-parallel group, and gradients flow back to each rank's shard. Only the
choice of the sampling's kept set (``vocab_parallel_truncate``) looks at whole rows, without gradient.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from relax.models.sampled_distribution import Truncation, dropped_tokens


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


def vocab_parallel_truncate(logits: torch.Tensor, truncation: Truncation | None,
                            targets: torch.Tensor) -> torch.Tensor:
    """``logits`` ``[..., V/tp]`` with the tokens outside the sampling's kept set
    (``relax.models.sampled_distribution``) at the most negative finite float, so that
    ``vocab_parallel_log_probs`` / ``vocab_parallel_entropy`` score the truncated, renormalized
    distribution the rollout sampled from. ``targets``: the sampled tokens' global ids (always kept).

    Top-p needs each row sorted over the whole vocabulary, so the shards are gathered for the decision
    (no gradient; a ``[..., V]`` float32 copy, what a tp=1 rank holds anyway) and each rank keeps its
    slice of the drop mask; the gradient still flows to each rank's own shard only."""
    if truncation is None or not truncation.truncates:
        return logits
    from megatron.core import parallel_state

    group = parallel_state.get_tensor_model_parallel_group()
    world = dist.get_world_size(group) if dist.is_initialized() else 1
    whole = logits.detach().float()
    if world > 1:
        shards = [torch.empty_like(whole) for _ in range(world)]
        dist.all_gather(shards, whole.contiguous(), group=group)
        whole = torch.cat(shards, dim=-1)
    drop = dropped_tokens(whole, truncation, targets)
    if world > 1:
        width = logits.shape[-1]
        start = dist.get_rank(group) * width
        drop = drop[..., start:start + width]
    return logits.float().masked_fill(drop, torch.finfo(torch.float32).min)
