"""How ``TorchBackend`` runs a transformers causal LM: ``forward_logits=hf_forward_logits``.

``TorchBackend``'s default adapter already reads ``.logits``; this one also turns the KV cache off.
Transformers models default to ``use_cache=True`` (from their config), which during a training or
scoring forward only allocates a cache that is thrown away.
"""

from __future__ import annotations

import torch


def hf_forward_logits(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
) -> torch.Tensor:
    """``[N, S, V]`` logits of a ``*ForCausalLM`` for left/right-padded rows (``TokenBatch`` layout)."""
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask.long(),
        position_ids=position_ids,
        use_cache=False,
    )
    return out.logits
