"""Core attention for the Megatron backend's local layer spec: ``scaled_dot_product_attention``.

megatron-core's local ``DotProductAttention`` (used when Transformer Engine is absent, always the
case on CPU) spells attention out as ``baddbmm`` + masked softmax + ``bmm`` through a preallocated
scratch buffer. ``torch.nn.functional.scaled_dot_product_attention`` computes the same function in
one call and picks a fused kernel where one exists: on the benchmark model it saves about 1 ms of a
~30 ms CPU step (``benchmarks/megatron_vs_torch.py``), and the torch backend's models already use it.

The swap covers what relax builds: vanilla softmax, no sliding window, no attention bias or packed
sequences, no query-key layer scaling, and dropout only when it is off. Anything else goes to
megatron-core's own implementation unchanged.
"""

from __future__ import annotations

import functools

import torch.nn.functional as F


def _dot_product_attention_class():
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    return DotProductAttention


@functools.cache
def sdpa_core_attention_class():
    """``DotProductAttention`` with its forward on ``scaled_dot_product_attention`` (built lazily:
    megatron-core is an optional dependency)."""
    base = _dot_product_attention_class()

    class SdpaDotProductAttention(base):
        """Same parameters, same inputs and outputs as megatron-core's ``DotProductAttention``:
        query ``[sq, b, np, hn]``, key/value ``[sk, b, ng, hn]``, ``attention_mask`` True where a
        query must not see a key (``[b, 1, sq, sk]``); returns ``[sq, b, np * hn]``."""

        def _sdpa_applies(self, attention_mask, attn_mask_type, attention_bias, packed_seq_params) -> bool:
            from megatron.core.transformer.enums import AttnMaskType

            dropout = self.attention_dropout.p if self.training else 0.0
            # without a mask only the causal case is SDPA's (is_causal=True)
            mask_ok = attention_mask is not None or (attn_mask_type or self.attn_mask_type) == AttnMaskType.causal
            return (mask_ok and attention_bias is None and packed_seq_params is None and self.softmax_offset is None
                    and self.scale_mask_softmax.window_size is None and not self.config.apply_query_key_layer_scaling
                    and dropout == 0.0)

        def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                    packed_seq_params=None):
            if not self._sdpa_applies(attention_mask, attn_mask_type, attention_bias, packed_seq_params):
                return super().forward(query, key, value, attention_mask, attn_mask_type, attention_bias,
                                       packed_seq_params)
            groups = self.num_attention_heads_per_partition // self.num_query_groups_per_partition
            # [s, b, n, h] -> [b, n, s, h]
            q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
            if groups > 1:  # grouped-query attention: each key/value head serves `groups` query heads
                k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
            if attention_mask is None:
                context = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.softmax_scale)
            else:
                context = F.scaled_dot_product_attention(q, k, v, attn_mask=~attention_mask, scale=self.softmax_scale)
            # [b, n, sq, h] -> [sq, b, n * h]
            sq, b = query.shape[0], query.shape[1]
            return context.permute(2, 0, 1, 3).reshape(sq, b, self.hidden_size_per_partition)

    return SdpaDotProductAttention


def local_layer_spec(**kwargs):
    """megatron-core's ``get_gpt_layer_local_spec(**kwargs)`` with ``SdpaDotProductAttention`` as the
    self-attention's core attention."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    spec = get_gpt_layer_local_spec(**kwargs)
    spec.submodules.self_attention.submodules.core_attention = sdpa_core_attention_class()
    return spec

