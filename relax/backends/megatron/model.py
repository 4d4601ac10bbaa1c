"""The built-in ``TinyCausalLM`` as a Megatron ``GPTModel``, and exact weight conversion both ways.

Architecture mapping (``relax/models/tiny/model.py`` is the reference; megatron-core 0.16 local spec):

=============================  ==================================================================
TinyCausalLM                   Megatron GPTModel (local spec, ``attention.local_layer_spec``)
=============================  ==================================================================
``tok_emb.weight`` [V, d]      ``embedding.word_embeddings.weight`` [V'/tp, d] (vocab-sharded; V'
                               is V padded to a multiple of tp, see ``padded_vocab_size``)
``pos_emb.weight``             ``embedding.position_embeddings.weight`` (learned_absolute, replicated)
``blocks.i.ln1``               ``decoder.layers.i.input_layernorm`` (LayerNorm, eps 1e-5, bias)
``attn.q/k/v_proj``            ``self_attention.linear_qkv`` [3d/tp, d]: rows grouped *per head* as
                               ``[q_h; k_h; v_h]`` (num_query_groups = n_heads), column-parallel
``attn.o_proj``                ``self_attention.linear_proj`` (row-parallel: weight split on dim 1,
                               bias whole)
``blocks.i.ln2``               ``decoder.layers.i.pre_mlp_layernorm``
``mlp.fc_in`` / ``fc_out``     ``mlp.linear_fc1`` (column-parallel) / ``mlp.linear_fc2`` (row-parallel)
``ln_f``                       ``decoder.final_layernorm``
logits ``ln_f(x) @ tok_emb.T``  tied output layer (``share_embeddings_and_output_weights``); with
                               pipeline parallelism the last stage holds a synced copy
                               ``output_layer.weight``
=============================  ==================================================================

Numerics that match by construction: exact-erf ``F.gelu`` (``bias_activation_fusion`` off), softmax
scale ``1/sqrt(d/H)`` (``apply_query_key_layer_scaling`` off), fp32 softmax, dropout 0, no bias on the
output layer. The core attention is ``scaled_dot_product_attention`` with the same boolean mask as
``TinyCausalLM`` (``relax.backends.megatron.attention``; megatron-core's own, which fills masked
scores with -10000, remains the fallback for what that does not cover; ``TinyCausalLM`` lets every
query see itself, so no row is fully masked either way). The padded vocab
rows (tp > 1 and V not divisible by tp) are masked out of the logits by ``mask_padded_vocab``.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F

from relax.models.tiny.model import TinyLMConfig

# Which dim of each Megatron tensor is split across tensor-parallel ranks (None: replicated).
_SHARD_DIM_BY_SUFFIX = {
    "word_embeddings.weight": 0,
    "output_layer.weight": 0,
    "linear_qkv.weight": 0,
    "linear_qkv.bias": 0,
    "linear_fc1.weight": 0,
    "linear_fc1.bias": 0,
    "linear_proj.weight": 1,
    "linear_fc2.weight": 1,
}

# Per-layer name pairs that map one-to-one (TinyCausalLM suffix -> Megatron suffix).
_LAYER_DIRECT = {
    "ln1.weight": "input_layernorm.weight",
    "ln1.bias": "input_layernorm.bias",
    "attn.o_proj.weight": "self_attention.linear_proj.weight",
    "attn.o_proj.bias": "self_attention.linear_proj.bias",
    "ln2.weight": "pre_mlp_layernorm.weight",
    "ln2.bias": "pre_mlp_layernorm.bias",
    "mlp.fc_in.weight": "mlp.linear_fc1.weight",
    "mlp.fc_in.bias": "mlp.linear_fc1.bias",
    "mlp.fc_out.weight": "mlp.linear_fc2.weight",
    "mlp.fc_out.bias": "mlp.linear_fc2.bias",
}


def shard_dim(megatron_name: str) -> int | None:
    for suffix, dim in _SHARD_DIM_BY_SUFFIX.items():
        if megatron_name.endswith(suffix):
            return dim
    return None


def padded_vocab_size(vocab_size: int, tp_size: int) -> int:
    """Megatron's vocab-parallel layers need the vocab divisible by tp: pad with rows never used."""
    return -(-vocab_size // tp_size) * tp_size


def transformer_config(cfg: TinyLMConfig, *, tp_size: int = 1, pp_size: int = 1, **overrides):
    """The ``TransformerConfig`` computing exactly what ``TinyCausalLM(cfg)`` computes."""
    from megatron.core.transformer import TransformerConfig

    if cfg.n_layers % pp_size:
        raise ValueError(
            f"--pipeline-model-parallel-size {pp_size} must divide the model's {cfg.n_layers} layers"
        )
    if cfg.n_heads % tp_size:
        raise ValueError(f"--tensor-model-parallel-size {tp_size} must divide the model's {cfg.n_heads} heads")
    kwargs = dict(
        num_layers=cfg.n_layers,
        hidden_size=cfg.d_model,
        num_attention_heads=cfg.n_heads,
        ffn_hidden_size=cfg.mlp_ratio * cfg.d_model,
        tensor_model_parallel_size=tp_size,
        pipeline_model_parallel_size=pp_size,
        normalization="LayerNorm",
        layernorm_epsilon=1e-5,
        add_bias_linear=True,
        activation_func=F.gelu,
        gated_linear_unit=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        apply_query_key_layer_scaling=False,
        attention_softmax_in_fp32=True,
        init_method_std=cfg.init_std,
        params_dtype=torch.float32,
        pipeline_dtype=torch.float32,
        use_cpu_initialization=True,  # also makes the tp-sharded init equal the tp=1 init
        perform_initialization=True,
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        bias_dropout_fusion=False,
        gradient_accumulation_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
    )
    kwargs.update(overrides)
    return TransformerConfig(**kwargs)


def build_gpt_model(cfg: TinyLMConfig, config, *, pre_process: bool = True, post_process: bool = True):
    """A ``GPTModel`` (learned absolute positions, tied embeddings) for this rank: the local spec, or
    Transformer Engine's on CUDA where it imports (``layer_specs.layer_spec``)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.tensor_parallel import ColumnParallelLinear

    from relax.backends.megatron.layer_specs import layer_spec

    model = GPTModel(
        config,
        layer_spec(),
        vocab_size=padded_vocab_size(cfg.vocab_size, config.tensor_model_parallel_size),
        max_sequence_length=cfg.max_seq_len,
        pre_process=pre_process,
        post_process=post_process,
        parallel_output=True,
        share_embeddings_and_output_weights=True,
        position_embedding_type="learned_absolute",
    )
    for layer in model.decoder.layers:
        # The MLP's first layer hands its bias back for a fused bias + activation kernel; with the
        # fusion off (exact GELU) the MLP adds it in a pass of its own over the [s, b, 4h]
        # activations. Adding it inside the linear layer instead is one ``addmm`` (same values).
        # (Local spec only: Transformer Engine's layers fix what they return when built.)
        if isinstance(layer.mlp.linear_fc1, ColumnParallelLinear):
            layer.mlp.linear_fc1.skip_bias_add = False
    return model


# ---------------------------------------------------------------------------------------------
# Full (unsharded) conversion. Megatron tensors here are whole, with the padded vocab.
# ---------------------------------------------------------------------------------------------


def tiny_to_megatron(state: Mapping[str, torch.Tensor], cfg: TinyLMConfig, *, tp_size: int = 1) -> dict:
    """``TinyCausalLM.state_dict()`` -> whole Megatron tensors (global layer numbers, padded vocab)."""
    missing = [k for k in _tiny_names(cfg) if k not in state]
    extra = [k for k in state if k not in set(_tiny_names(cfg))]
    if missing or extra:
        raise KeyError(f"not a TinyCausalLM state dict for {cfg}: missing {missing}, unexpected {extra}")
    d, heads = cfg.d_model, cfg.n_heads
    head_dim = d // heads
    vocab = padded_vocab_size(cfg.vocab_size, tp_size)
    emb = state["tok_emb.weight"].detach()
    if vocab != cfg.vocab_size:
        emb = torch.cat([emb, emb.new_zeros(vocab - cfg.vocab_size, d)])
    out = {
        "embedding.word_embeddings.weight": emb,
        "embedding.position_embeddings.weight": state["pos_emb.weight"].detach(),
        "decoder.final_layernorm.weight": state["ln_f.weight"].detach(),
        "decoder.final_layernorm.bias": state["ln_f.bias"].detach(),
    }
    for i in range(cfg.n_layers):
        t, m = f"blocks.{i}.", f"decoder.layers.{i}."
        for tiny_suffix, mg_suffix in _LAYER_DIRECT.items():
            out[m + mg_suffix] = state[t + tiny_suffix].detach()
        # Megatron's fused qkv: per head h, rows [q_h; k_h; v_h] (one query group per head).
        for kind, shape in (("weight", (heads, head_dim, d)), ("bias", (heads, head_dim))):
            q, k, v = (state[f"{t}attn.{p}_proj.{kind}"].detach().reshape(shape) for p in "qkv")
            out[f"{m}self_attention.linear_qkv.{kind}"] = torch.cat([q, k, v], dim=1).reshape(3 * d, *shape[2:])
    return out


def megatron_to_tiny(state: Mapping[str, torch.Tensor], cfg: TinyLMConfig) -> dict[str, torch.Tensor]:
    """Whole Megatron tensors (as from ``tiny_to_megatron`` / ``gather_full_state``) -> TinyCausalLM names."""
    d, heads = cfg.d_model, cfg.n_heads
    head_dim = d // heads
    out = {
        "tok_emb.weight": state["embedding.word_embeddings.weight"][: cfg.vocab_size],
        "pos_emb.weight": state["embedding.position_embeddings.weight"],
        "ln_f.weight": state["decoder.final_layernorm.weight"],
        "ln_f.bias": state["decoder.final_layernorm.bias"],
    }
    for i in range(cfg.n_layers):
        t, m = f"blocks.{i}.", f"decoder.layers.{i}."
        for tiny_suffix, mg_suffix in _LAYER_DIRECT.items():
            out[t + tiny_suffix] = state[m + mg_suffix]
        for kind in ("weight", "bias"):
            qkv = state[f"{m}self_attention.linear_qkv.{kind}"]
            per_head = qkv.reshape(heads, 3, head_dim, *qkv.shape[1:])
            for j, p in enumerate("qkv"):
                out[f"{t}attn.{p}_proj.{kind}"] = per_head[:, j].reshape(d, *qkv.shape[1:])
    return {k: v.detach().clone().contiguous() for k, v in out.items()}


def _tiny_names(cfg: TinyLMConfig) -> list[str]:
    names = ["tok_emb.weight", "pos_emb.weight", "ln_f.weight", "ln_f.bias"]
    for i in range(cfg.n_layers):
        names += [f"blocks.{i}.{s}" for s in _LAYER_DIRECT]
        names += [f"blocks.{i}.attn.{p}_proj.{k}" for p in "qkv" for k in ("weight", "bias")]
    return names


# ---------------------------------------------------------------------------------------------
# Sharding: whole tensors <-> this rank's module state (local layer numbers, tp shards).
# ---------------------------------------------------------------------------------------------


def _local_to_global(name: str, layer_offset: int) -> str:
    if name.startswith("decoder.layers."):
        rest = name[len("decoder.layers.") :]
        idx, tail = rest.split(".", 1)
        return f"decoder.layers.{int(idx) + layer_offset}.{tail}"
    return name


def local_tensors(model) -> dict[str, torch.Tensor]:
    """This rank's parameters by Megatron module name as the local spec spells it (no ``_extra_state``;
    see ``layer_specs.canonical_name``)."""
    from relax.backends.megatron.layer_specs import canonical_name

    return {canonical_name(k): v for k, v in model.state_dict().items() if not k.endswith("_extra_state")}


def shard_full_state(
    full: Mapping[str, torch.Tensor], targets: Mapping[str, torch.Tensor], *, tp_rank: int, tp_size: int, layer_offset: int
) -> None:
    """Copy this rank's shard of the whole Megatron tensors ``full`` into ``targets`` (local names), in place."""
    with torch.no_grad():
        for name, target in targets.items():
            source_name = _local_to_global(name, layer_offset)
            if name == "output_layer.weight":  # pipeline last stage: its copy of the tied embedding
                source_name = "embedding.word_embeddings.weight"
            if source_name not in full:
                raise KeyError(f"no source tensor for Megatron parameter {name!r} (looked up {source_name!r})")
            tensor = full[source_name]
            dim = shard_dim(name)
            if dim is not None:
                tensor = tensor.chunk(tp_size, dim=dim)[tp_rank]
            if target.shape != tensor.shape:
                raise ValueError(f"{name}: shard shape {tuple(tensor.shape)} != parameter {tuple(target.shape)}")
            target.copy_(tensor)


def gather_full_state(
    local: Mapping[str, torch.Tensor], *, tp_group, pp_group, layer_offset: int
) -> dict[str, torch.Tensor]:
    """Whole Megatron tensors, on the CPU, from every rank's ``local`` shards (on the rank's device; a
    collective over the tp and pp groups)."""
    import torch.distributed as dist

    tp_size = dist.get_world_size(tp_group)
    mine = {}
    for name, tensor in local.items():
        if name == "output_layer.weight":  # a synced copy of the embedding, not a weight of its own
            continue
        tensor = tensor.detach()
        dim = shard_dim(name)
        if dim is not None and tp_size > 1:
            parts = [torch.empty_like(tensor) for _ in range(tp_size)]
            dist.all_gather(parts, tensor.contiguous(), group=tp_group)
            tensor = torch.cat(parts, dim=dim)
        # whole weights leave the rank as CPU tensors (also what the pipeline stages exchange)
        mine[_local_to_global(name, layer_offset)] = tensor.to("cpu", copy=True)
    if dist.get_world_size(pp_group) == 1:
        return mine
    stages: list = [None] * dist.get_world_size(pp_group)
    dist.all_gather_object(stages, mine, group=pp_group)
    merged: dict[str, torch.Tensor] = {}
    for stage in stages:
        merged.update(stage)
    return merged


def mask_padded_vocab(logits: torch.Tensor, vocab_size: int, *, tp_rank: int) -> torch.Tensor:
    """Give the padded vocab entries of this rank's logit shard zero probability (out of place)."""
    part = logits.shape[-1]
    start = tp_rank * part
    if start + part <= vocab_size:
        return logits
    ids = torch.arange(start, start + part, device=logits.device)
    # A large finite value rather than -inf: exp() is exactly 0 and p * logit stays 0 (not nan).
    return logits.masked_fill(ids >= vocab_size, -1e9)
