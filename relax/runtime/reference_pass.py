"""The reference policy's per-token log-probs of a shard (the KL term's other side).

The reference model is frozen and plain torch whatever ``--backend`` trains the policy, so the actor
runs its forward itself: in ``--micro-batch-size`` rows (the whole shard without it), or with
``--max-tokens-per-micro-batch`` in the policy's packed micro-batches of at most that many real
tokens (``relax.backends.token_budget``), so that the reference pass needs no more memory than the
policy's passes do.
"""

from __future__ import annotations

import torch
from torch import nn

from relax.backends import token_budget
from relax.config.run import RunConfig
from relax.models.batch import TokenBatch, response_log_probs
from relax.models.factory import forward_logits_fn
from relax.models.sampled_distribution import Truncation


@torch.no_grad()
def reference_log_probs(model: nn.Module, batch: TokenBatch, config: RunConfig) -> torch.Tensor:
    """``[N, T]`` log-probs of ``batch``'s response tokens under ``model``, zero outside the response."""
    # the reference scores the distribution the policy is scored on: the same temperature and kept-set rule
    temperature, truncation = config.rollout_temperature, Truncation.of_run(config)
    if config.max_tokens_per_micro_batch:
        return token_budget.packed_log_probs_within(model, batch, config.max_tokens_per_micro_batch,
                                                    temperature=temperature, truncation=truncation)
    forward = forward_logits_fn(config)
    device = next(model.parameters()).device
    batch = batch if batch.prompt_ids.device == device else batch.to(device)
    size = config.micro_batch_size or len(batch)
    parts = []
    for start in range(0, len(batch), size):
        sub = batch.select(slice(start, start + size))
        logits = forward(model, sub.input_ids, sub.attention_mask, sub.position_ids)
        parts.append(response_log_probs(logits, sub, with_entropy=False, temperature=temperature,
                                        truncation=truncation).log_probs)
    return torch.cat(parts)
