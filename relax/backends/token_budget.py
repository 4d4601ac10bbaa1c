"""The torch backend's token-budget helpers (``--max-tokens-per-micro-batch``, ``relax.models.packing``):
which backends may pack, putting packed micro-batches back in row order, and the step's packing counts."""

from __future__ import annotations

import torch

from relax.models import packing
from relax.models.batch import ForwardLogits, TokenBatch, TokenLogProbs, default_forward_logits
from relax.models.hf.adapter import hf_forward_logits


def checked_budget(budget: int | None, value_head: bool, forward_logits: ForwardLogits) -> int | None:
    """The budget a ``TorchBackend`` may pack with: a policy backend with one of relax's forwards (a
    custom ``forward_logits`` cannot be handed a packed row)."""
    if budget is None:
        return None
    if budget < 1:
        raise ValueError(f"max_tokens_per_micro_batch (--max-tokens-per-micro-batch) must be >= 1, got {budget}")
    if value_head:
        raise ValueError("max_tokens_per_micro_batch packs the policy's passes; the critic trains on padded micro-batches")
    if forward_logits not in (default_forward_logits, hf_forward_logits):
        raise ValueError("max_tokens_per_micro_batch runs its own packed forward (relax.models.packed_forward); "
                         "it cannot be combined with a custom forward_logits")
    return budget


def in_row_order(parts: list, n: int, with_entropy: bool) -> TokenLogProbs:
    """Packed micro-batches' ``(rows, TokenLogProbs)`` -> one ``[N, T]`` result in the batch's row order."""
    log_probs = parts[0][1].log_probs.new_zeros((n, parts[0][1].log_probs.shape[1]))
    entropy = torch.zeros_like(log_probs) if with_entropy else None
    for rows, x in parts:
        log_probs[rows] = x.log_probs
        if with_entropy:
            entropy[rows] = x.entropy
    return TokenLogProbs(log_probs=log_probs, entropy=entropy)


def packing_metrics(plan: packing.PackPlan, batch: TokenBatch) -> dict[str, float]:
    """Counts (they add up over data-parallel ranks): micro-batches run, tokens computed packed, and the
    tokens the padded ``[N, P + T]`` layout of the same rows would have computed."""
    return {"micro_batches": float(len(plan.groups)), "packed_tokens": float(plan.packed_tokens),
            "padded_tokens": float(batch.input_ids.numel())}
