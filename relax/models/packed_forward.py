"""The logits of a packed row (``relax.models.packing.PackedRows``) with attention kept inside each sample,
projected onto the vocabulary only at the positions that score a response token (``score_at``): the
language-model head is the widest matrix of a small model, and in the padded path it also runs on
every prompt and padding column.

- The built-in ``TinyCausalLM``: its blocks take an explicit ``[B, 1, L, L]`` mask, so the packed row
  gets a block-diagonal causal one (the model is small; a dense mask costs little at its widths).
- transformers ``*ForCausalLM`` (and a ``peft`` model around one): for the forward, the model's
  attention implementation is switched to ``relax_packed``, registered with transformers'
  ``AttentionInterface``. It runs ``sdpa`` causally on each sample's slice of the queries, keys and
  values (``split``, whose backward is one concatenation), so the cost is the sum of the samples' squared lengths (a dense block-diagonal mask over the
  row would cost the square of the whole row), and no ``[L, L]`` mask is ever built (an implementation
  unknown to transformers' mask registry gets ``attention_mask=None``). On CUDA in half precision one
  fused variable-length call per layer does the same (``relax.models.varlen_attention``). Rotary
  embeddings come from the per-sample ``position_ids`` that restart at 0, and ``logits_to_keep`` (a
  1-D index tensor) keeps the head's rows to the scored positions. Models with sliding-window layers
  are refused (the per-sample causal attention would ignore the window).
"""

from __future__ import annotations

import contextlib
import itertools

import torch
from torch import nn

from relax.models import varlen_attention
from relax.models.batch import TokenBatch, TokenLogProbs
from relax.models.packing import PackedRows, response_log_probs_packed
from relax.models.sampled_distribution import Truncation

PACKED_ATTENTION = "relax_packed"
_BOUNDS_KWARG = "relax_sample_bounds"
_CU_SEQLENS_KWARG = "relax_cu_seqlens"  # the bounds as an int32 tensor on the row's device, made once per forward


def packed_logits(model: nn.Module, packed: PackedRows) -> torch.Tensor:
    """``[K, V]`` logits at ``packed.score_at`` of ``packed.input_ids``, each sample attending only to itself."""
    if hasattr(model, "blocks") and hasattr(model, "hidden_states"):  # TinyCausalLM
        allowed = block_causal_mask(packed.cu_seqlens, packed.input_ids.shape[1])
        hidden = model.hidden_states(packed.input_ids, allowed, packed.position_ids)[0, packed.score_at]
        return hidden @ model.tok_emb.weight.T
    if not hasattr(model, "config") or not hasattr(model.config, "_attn_implementation"):
        raise TypeError(
            f"--max-tokens-per-micro-batch packs samples for the built-in model and transformers models; "
            f"{type(model).__name__} is neither (drop the flag to train it on padded micro-batches)")
    bounds = tuple(int(x) for x in packed.cu_seqlens.tolist())
    with packed_attention(model):
        out = model(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False,
                    logits_to_keep=packed.score_at,
                    **{_BOUNDS_KWARG: bounds, _CU_SEQLENS_KWARG: packed.cu_seqlens.to(torch.int32)})
    return out.logits.reshape(-1, out.logits.shape[-1])


def packed_log_probs(model: nn.Module, batch: TokenBatch, rows: torch.Tensor, *, with_entropy: bool,
                     temperature: float = 1.0, autocast=contextlib.nullcontext,
                     truncation: Truncation | None = None, with_distribution: bool = False) -> TokenLogProbs:
    """``[n, T]`` log-probs (and entropy) of ``batch``'s ``rows`` run as one padding-free packed row
    (``batch`` on the model's device). ``autocast``: a context for the forward only (``--bf16``); the
    log-softmax stays float32. ``truncation``: the sampling's kept set (``relax.models.sampled_distribution``)."""
    packed = PackedRows.build(batch, rows)
    with autocast():
        logits = packed_logits(model, packed)
    log_probs, entropy, distribution = response_log_probs_packed(
        logits, packed, with_entropy=with_entropy, temperature=temperature, truncation=truncation,
        with_distribution=with_distribution)
    return TokenLogProbs(log_probs=log_probs, entropy=entropy, all_log_probs=distribution)


def block_causal_mask(cu_seqlens: torch.Tensor, length: int) -> torch.Tensor:
    """``[1, 1, L, L]`` bool: query i sees key j iff both are in the same sample and j <= i."""
    sample = torch.repeat_interleave(torch.arange(len(cu_seqlens) - 1, device=cu_seqlens.device),
                                     cu_seqlens.diff())
    pos = torch.arange(length, device=cu_seqlens.device)
    allowed = (sample[:, None] == sample[None, :]) & (pos[None, :] <= pos[:, None])
    return allowed[None, None]


@contextlib.contextmanager
def packed_attention(model: nn.Module):
    """Within the block, a transformers ``model`` attends with ``relax_packed`` (nothing to do for the
    built-in model). A training step holds it over its backward passes too: activation recomputation
    (``--recompute-activations``) re-runs the layers' forward there and must attend the same way."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "_attn_implementation") or hasattr(model, "blocks"):
        yield
        return
    _register()
    previous = config._attn_implementation
    config._attn_implementation = PACKED_ATTENTION
    try:
        yield
    finally:
        config._attn_implementation = previous


def _packed_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """transformers' attention-function contract: ``query`` ``[1, H, L, D]`` (keys/values may have
    fewer heads, GQA) -> ``([1, L, H, D], None)``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    bounds = kwargs.get(_BOUNDS_KWARG)
    if bounds is None:
        raise RuntimeError(f"the {PACKED_ATTENTION!r} attention needs the packed row's sample bounds "
                           "(relax.models.packed_forward.packed_logits passes them)")
    if kwargs.get("sliding_window") is not None:
        raise ValueError(
            "--max-tokens-per-micro-batch: this model has sliding-window attention layers, which packed "
            "per-sample attention does not implement; drop the flag to train on padded micro-batches")
    sizes = [e - s for s, e in itertools.pairwise(bounds)]
    cu_seqlens = kwargs.get(_CU_SEQLENS_KWARG)
    if cu_seqlens is not None and varlen_attention.usable(query, dropout, scaling):
        return varlen_attention.causal_varlen_attention(query, key, value, cu_seqlens, max(sizes), scaling), None
    parts = [
        sdpa_attention_forward(module, q, k, v, None, dropout=dropout, scaling=scaling, is_causal=True)[0]
        for q, k, v in zip(query.split(sizes, dim=2), key.split(sizes, dim=2), value.split(sizes, dim=2))
    ]
    return torch.cat(parts, dim=1), None


def _register() -> None:
    from transformers import AttentionInterface

    if PACKED_ATTENTION not in AttentionInterface._global_mapping:
        AttentionInterface.register(PACKED_ATTENTION, _packed_attention)
