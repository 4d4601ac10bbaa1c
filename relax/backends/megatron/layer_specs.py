"""Which transformer-layer implementation a Megatron ``GPTModel`` is built from.

Transformer Engine's layer spec (fused kernels) when the model trains on CUDA and
``transformer_engine`` imports; megatron-core's local spec otherwise (always on the CPU), with
``scaled_dot_product_attention`` as its core attention (``relax.backends.megatron.attention``).

Two things differ between the specs that the rest of the backend must not see:

- Transformer Engine fuses each layer's two norms into the linear layer after them, so their
  weights are named ``self_attention.linear_qkv.layer_norm_*`` and ``mlp.linear_fc1.layer_norm_*``
  instead of ``input_layernorm.*`` and ``pre_mlp_layernorm.*``. :func:`canonical_name` maps them back,
  so the weight conversions (which speak the local spec's names) serve both.
- Transformer Engine's attention ignores the mask argument under its default causal mask type.
  relax's batches are left-padded and the mask also hides the padding keys, so the spec asks for an
  arbitrary mask (the one the backend passes), as the local attention already uses.
"""

from __future__ import annotations

import functools
import importlib.util

import torch

# Transformer Engine's fused norm weights -> the local spec's names (same tensors, same shapes).
_TE_FUSED_NORM_NAMES = {
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "self_attention.linear_qkv.layer_norm_bias": "input_layernorm.bias",
    "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight",
    "mlp.linear_fc1.layer_norm_bias": "pre_mlp_layernorm.bias",
}


def canonical_name(name: str) -> str:
    """A Megatron parameter name as the local spec spells it (the identity for local-spec models)."""
    for fused, local in _TE_FUSED_NORM_NAMES.items():
        if name.endswith("." + fused):
            return name[: -len(fused)] + local
    return name


@functools.cache
def transformer_engine_importable() -> bool:
    if importlib.util.find_spec("transformer_engine") is None:
        return False
    try:
        import transformer_engine.pytorch  # noqa: F401
    except Exception:  # noqa: BLE001 - a broken install (e.g. built for another CUDA) is "not there"
        return False
    return True


def uses_transformer_engine() -> bool:
    """Build with Transformer Engine's spec? Only on CUDA, and only where it imports."""
    return torch.cuda.is_available() and transformer_engine_importable()


def layer_spec(*, qk_layernorm: bool = False, normalization: str | None = None,
               transformer_engine: bool | None = None):
    """The ``GPTModel`` layer spec (``transformer_engine``: None chooses by :func:`uses_transformer_engine`).
    ``normalization`` is the local spec's; Transformer Engine's layers read it from the config."""
    if transformer_engine is None:
        transformer_engine = uses_transformer_engine()
    if not transformer_engine:
        from relax.backends.megatron.attention import local_layer_spec

        kwargs = {"qk_layernorm": qk_layernorm}
        if normalization is not None:
            kwargs["normalization"] = normalization
        return local_layer_spec(**kwargs)
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec
    from megatron.core.transformer.enums import AttnMaskType

    spec = get_gpt_layer_with_transformer_engine_spec(qk_layernorm=qk_layernorm)
    attention = spec.submodules.self_attention
    attention.params = {**attention.params, "attn_mask_type": AttnMaskType.arbitrary}
    return spec
