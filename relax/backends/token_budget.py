"""The torch backend's token-budget helpers (``--max-tokens-per-micro-batch``, ``relax.models.packing``):
which backends may pack, putting packed micro-batches back in row order, and the step's packing counts;
and the forward-only passes outside the policy backend: the reference model's log-probs (packed like
the policy's) and the critic's values (padded rows, as many as the budget holds)."""

from __future__ import annotations

import torch
from torch import nn

from relax.models import packing
from relax.models.batch import ForwardLogits, TokenBatch, TokenLogProbs, default_forward_logits
from relax.models.hf.adapter import hf_forward_logits
from relax.models.packed_forward import packed_log_probs
from relax.models.sampled_distribution import Truncation


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


@torch.no_grad()
def packed_log_probs_within(model: nn.Module, batch: TokenBatch, budget: int, *, temperature: float = 1.0,
                            truncation: Truncation | None = None) -> torch.Tensor:
    """``[N, T]`` log-probs of a frozen ``model`` (the reference policy) over ``batch``, in micro-batches
    of at most ``budget`` real tokens each run as one packed row: the policy's grouping and forward, so
    no forward of this pass holds more than the policy's do."""
    device = next(model.parameters()).device
    batch = batch if batch.prompt_ids.device == device else batch.to(device)
    plan = packing.plan_micro_batches(packing.sample_lengths(batch), budget)
    parts = []
    for group in plan.groups:
        rows = torch.tensor(group, dtype=torch.long, device=device)
        parts.append((rows, packed_log_probs(model, batch, rows, with_entropy=False, temperature=temperature,
                                             truncation=truncation)))
    return in_row_order(parts, len(batch), with_entropy=False).log_probs


def padded_rows_within(budget: int | None, batch: TokenBatch) -> int | None:
    """Rows per padded micro-batch so that one forward computes at most ``budget`` tokens (at least one
    row: a row wider than the budget runs alone); None without a budget (the caller's own default).
    For the critic's value pass, whose value head has no packed forward."""
    if budget is None:
        return None
    return max(1, budget // max(1, batch.input_ids.shape[1]))
