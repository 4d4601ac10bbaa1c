"""The forward pass of ``MegatronBackend``: a batch's inputs on the model's device (token ids,
positions and the attention mask Megatron takes), its logits, and the response tokens' log-probs
(vocabulary-parallel: each tensor rank holds a slice of the vocabulary).

A mixin: it reads the backend's module (``gpt``), ``temperature``, ``truncation``, ``model_config``,
``tp_rank`` and the forward keyword arguments fixed at construction (``_forward_kwargs``).
"""

from __future__ import annotations

import torch

from relax.backends.base import TokenBatch, TokenLogProbs
from relax.backends.megatron.logprobs import (
    vocab_parallel_entropy,
    vocab_parallel_log_probs,
    vocab_parallel_truncate,
)
from relax.backends.megatron.model import mask_padded_vocab


class ForwardPass:
    """A batch through the backend's model (see the module's docstring)."""

    @property
    def device(self) -> torch.device:
        """Where the model's parameters are (the rank's CUDA device, or the CPU); inputs go there."""
        return next(self.gpt.parameters()).device

    def _on_device(self, batch: TokenBatch, device: torch.device | None = None) -> TokenBatch:
        """``batch`` on ``device`` (default: the model's), where its masks and targets meet the
        model's outputs."""
        device = self.device if device is None else device
        return batch if batch.prompt_ids.device == device else batch.to(device)

    def _model_inputs(self, batch: TokenBatch, device: torch.device):
        """Token ids, positions and the attention mask of ``batch``, on ``device``."""
        batch = self._on_device(batch, device)
        ids, mask, pos = batch.input_ids, batch.attention_mask, batch.position_ids
        s = ids.shape[1]
        idx = torch.arange(s, device=ids.device)
        causal = idx[None, :] <= idx[:, None]
        # Same visibility as TinyCausalLM: causal, real keys only, and every query sees itself.
        allowed = (causal & mask[:, None, :]) | torch.eye(s, dtype=torch.bool, device=ids.device)
        return ids, pos, ~allowed[:, None]  # Megatron masks where True

    def _forward(self, model, batch: TokenBatch) -> torch.Tensor:
        """Logits ``[b, s, V/tp]`` of ``batch`` through ``model`` (the DDP wrapper, or the one the
        pipeline schedule hands over), with the inputs on that model's device."""
        device = next(model.parameters()).device
        return model(*self._model_inputs(batch, device), **self._forward_kwargs)

    def _token_log_probs(self, logits: torch.Tensor, batch: TokenBatch, with_entropy: bool) -> TokenLogProbs:
        """Response-token log-probs from full-sequence logits ``[b, P+T, V/tp]`` (token t at column P+t-1)."""
        batch = self._on_device(batch, logits.device)
        p, t = batch.prompt_width, batch.response_ids.shape[1]
        logits = logits[:, p - 1 : p + t - 1].float()
        if self.temperature != 1.0:  # match a rollout that sampled at this temperature
            logits = logits / self.temperature
        logits = mask_padded_vocab(logits, self.model_config.vocab_size, tp_rank=self.tp_rank)
        logits = vocab_parallel_truncate(logits, self.truncation, batch.response_ids)
        mask = batch.response_mask
        log_probs = vocab_parallel_log_probs(logits, batch.response_ids) * mask
        entropy = vocab_parallel_entropy(logits) * mask if with_entropy else None
        return TokenLogProbs(log_probs=log_probs, entropy=entropy)
