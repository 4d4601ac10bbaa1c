"""Hugging Face Llama / Qwen2 / Qwen3 (dense) <-> Megatron ``GPTModel``: config and weights, both ways.

The Megatron path for an HF checkpoint: ``hf_transformer_config(hf_config)`` and
``build_hf_gpt_model(hf_config, config)`` build the matching GPTModel (local spec, RMSNorm, SwiGLU,
RoPE, grouped-query attention, Qwen2's qkv bias, Qwen3's q/k RMSNorm), then
``hf_to_megatron(hf_state, hf_config)`` gives its weights as whole tensors and ``tp_slice(...)``
this rank's tensor-parallel slice (``load_hf_state_into`` does both for one rank's module).
``megatron_to_hf`` reverses it (``gather_hf_state`` over the ranks), so a trained Megatron model is
saved with ``save_pretrained`` like any other. ``MegatronBackend`` uses it through
``relax.backends.megatron.families.HFFamily`` for ``--backend megatron --hf-checkpoint``, and
``checkpoint_errors`` refuses an unsupported checkpoint or layout before Ray starts
(see ``docs/en/real-models.md``).

Name and layout mapping (layer i; H query heads, G key/value groups, d head dim, F ffn size):

==========================================  ==========================================================
Hugging Face                                Megatron GPTModel (local spec)
==========================================  ==========================================================
``model.embed_tokens.weight`` [V, h]        ``embedding.word_embeddings.weight`` [V', h] (V' = V padded
                                            to a multiple of tp; extra rows zero)
``lm_head.weight``                          ``output_layer.weight`` (absent when embeddings are tied)
``model.norm.weight``                       ``decoder.final_layernorm.weight``
``layers.i.input_layernorm.weight``         ``decoder.layers.i.input_layernorm.weight``
``layers.i.post_attention_layernorm``       ``decoder.layers.i.pre_mlp_layernorm.weight``
``self_attn.{q,k,v}_proj.{weight,bias}``    ``self_attention.linear_qkv.{weight,bias}``: per query group
                                            g, rows ``[q heads of g (H/G * d); k_g (d); v_g (d)]``
``self_attn.o_proj.weight``                 ``self_attention.linear_proj.weight``
``self_attn.{q,k}_norm.weight`` (Qwen3)     ``self_attention.{q,k}_layernorm.weight``
``mlp.gate_proj`` / ``mlp.up_proj``         ``mlp.linear_fc1.weight`` = ``[gate; up]`` [2F, h]
``mlp.down_proj.weight``                    ``mlp.linear_fc2.weight``
==========================================  ==========================================================

Rotary embeddings need no weights: both sides use the non-interleaved ("rotate half") layout with
``rotary_base = rope_theta`` over the full head dim. Only the default RoPE is supported; a config
with ``rope_scaling`` (Llama 3.1 "llama3", YaRN, ...) is rejected rather than silently mis-converted.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")


def model_dims(hf_config) -> dict:
    """The shapes and options of a supported HF config; ``ValueError`` naming the fix otherwise."""
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"HF -> Megatron conversion supports {', '.join(SUPPORTED_MODEL_TYPES)} (dense) checkpoints; "
            f"got model_type={model_type!r}. Use the torch backend (--backend torch) for other models."
        )
    rope_scaling = _rope_scaling(hf_config)
    if rope_scaling:
        raise ValueError(
            f"rope_scaling={rope_scaling!r} is not supported by the Megatron converter (only the default "
            "RoPE); use --backend torch for this checkpoint"
        )
    heads = hf_config.num_attention_heads
    groups = getattr(hf_config, "num_key_value_heads", None) or heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
    if heads % groups:
        raise ValueError(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {groups}")
    return {
        "model_type": model_type,
        "hidden": hf_config.hidden_size,
        "heads": heads,
        "groups": groups,
        "head_dim": head_dim,
        "ffn": hf_config.intermediate_size,
        "layers": hf_config.num_hidden_layers,
        "vocab": hf_config.vocab_size,
        "tied": bool(getattr(hf_config, "tie_word_embeddings", False)),
        "qkv_bias": model_type == "qwen2" or bool(getattr(hf_config, "attention_bias", False)),
        "qk_norm": model_type == "qwen3",
    }


def _rope_scaling(hf_config):
    """A non-default rope type, if any (transformers 4.x ``rope_scaling`` or 5.x ``rope_parameters``)."""
    scaling = getattr(hf_config, "rope_scaling", None)
    if scaling and scaling.get("rope_type", scaling.get("type", "default")) != "default":
        return scaling
    params = getattr(hf_config, "rope_parameters", None)
    if isinstance(params, Mapping) and params.get("rope_type", "default") != "default":
        return params
    return None


def rope_theta(hf_config) -> float:
    params = getattr(hf_config, "rope_parameters", None)
    if isinstance(params, Mapping) and "rope_theta" in params:
        return float(params["rope_theta"])
    return float(getattr(hf_config, "rope_theta", 10000.0))


def padded_vocab_size(vocab_size: int, tp_size: int) -> int:
    return -(-vocab_size // tp_size) * tp_size


def layout_errors(dims: dict, *, tp_size: int, pp_size: int) -> list[str]:
    """Why this model cannot be split ``tp_size`` x ``pp_size`` ways (empty: it can). Query groups stay
    whole on a tensor-parallel rank, so tp must divide num_key_value_heads (and so the heads);
    pipeline stages hold equal numbers of layers."""
    errors = []
    if dims["groups"] % tp_size:
        errors.append(
            f"--tensor-model-parallel-size {tp_size} must divide the model's num_key_value_heads "
            f"{dims['groups']} (num_attention_heads {dims['heads']}): use a divisor of {dims['groups']}"
        )
    if dims["layers"] % pp_size:
        errors.append(
            f"--pipeline-model-parallel-size {pp_size} must divide the model's {dims['layers']} layers "
            "(num_hidden_layers)"
        )
    return errors


def checkpoint_errors(path, *, tp_size: int, pp_size: int) -> list[str]:
    """What keeps the checkpoint at ``path`` from training on ``--backend megatron`` with this layout,
    from its ``config.json`` alone (no weights, no megatron-core), so that ``relax train`` refuses it
    before Ray starts. A directory that is not a checkpoint gives nothing here: the ``--hf-checkpoint``
    check reports it."""
    import json
    from pathlib import Path

    config_file = Path(path) / "config.json"
    try:
        model_type = json.loads(config_file.read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return []
    where = f"--hf-checkpoint {path} (model_type {model_type!r}) with --backend megatron"
    if model_type not in SUPPORTED_MODEL_TYPES:
        return [
            f"{where}: the Megatron backend converts {', '.join(SUPPORTED_MODEL_TYPES)} (dense) checkpoints "
            "only; use --backend torch for this model"
        ]
    try:
        from transformers import AutoConfig

        hf_config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    except Exception:  # noqa: BLE001 - an unloadable config is reported by the --hf-checkpoint check
        return []
    try:
        dims = model_dims(hf_config)
    except ValueError as exc:
        return [f"{where}: {exc}"]
    return [f"{where}: {e}" for e in layout_errors(dims, tp_size=tp_size, pp_size=pp_size)]


def hf_transformer_config(
    hf_config, *, tp_size: int = 1, pp_size: int = 1, params_dtype=torch.float32, **overrides
):
    """The Megatron ``TransformerConfig`` that computes what the HF model computes (dropout 0, no fusions)."""
    from megatron.core.transformer import TransformerConfig

    dims = model_dims(hf_config)
    errors = layout_errors(dims, tp_size=tp_size, pp_size=pp_size)
    if errors:
        raise ValueError("; ".join(errors))
    kwargs = {
        "num_layers": dims["layers"],
        "hidden_size": dims["hidden"],
        "num_attention_heads": dims["heads"],
        "num_query_groups": dims["groups"],
        "kv_channels": dims["head_dim"],
        "ffn_hidden_size": dims["ffn"],
        "tensor_model_parallel_size": tp_size,
        "pipeline_model_parallel_size": pp_size,
        "normalization": "RMSNorm",
        "layernorm_epsilon": hf_config.rms_norm_eps,
        "add_bias_linear": False,
        "add_qkv_bias": dims["qkv_bias"],
        "qk_layernorm": dims["qk_norm"],
        "gated_linear_unit": True,
        "activation_func": F.silu,
        "hidden_dropout": 0.0,
        "attention_dropout": 0.0,
        "apply_query_key_layer_scaling": False,
        "attention_softmax_in_fp32": True,
        "params_dtype": params_dtype,
        "pipeline_dtype": params_dtype,
        "use_cpu_initialization": True,
        "perform_initialization": False,  # every weight is overwritten by the converted checkpoint
        "bias_activation_fusion": False,
        "masked_softmax_fusion": False,
        "bias_dropout_fusion": False,
        "gradient_accumulation_fusion": False,
        "apply_rope_fusion": False,
        "persist_layer_norm": False,
    }
    kwargs.update(overrides)
    return TransformerConfig(**kwargs)


def build_hf_gpt_model(hf_config, config, *, pre_process: bool = True, post_process: bool = True):
    """A ``GPTModel`` for this rank, shaped like the HF model of ``hf_config`` (the local spec, or
    Transformer Engine's on CUDA where it imports: ``layer_specs.layer_spec``)."""
    from megatron.core.models.gpt import GPTModel
    from relax.backends.megatron.layer_specs import layer_spec

    dims = model_dims(hf_config)
    spec = layer_spec(qk_layernorm=dims["qk_norm"], normalization="RMSNorm")
    model = GPTModel(
        config,
        spec,
        vocab_size=padded_vocab_size(dims["vocab"], config.tensor_model_parallel_size),
        max_sequence_length=hf_config.max_position_embeddings,
        pre_process=pre_process,
        post_process=post_process,
        parallel_output=True,
        share_embeddings_and_output_weights=dims["tied"],
        position_embedding_type="rope",
        rotary_percent=1.0,
        rotary_base=rope_theta(hf_config),
    )
    mark_tensor_parallel(model)
    return model


def mark_tensor_parallel(model) -> None:
    """Mark the tp-sharded weights as megatron-core's initialization would.

    ``perform_initialization=False`` (every weight comes from the checkpoint) also skips the call that
    sets ``tensor_model_parallel`` / ``partition_dim`` on the sharded weights. Megatron's gradient norm
    counts an unmarked weight as a replica, on tensor-parallel rank 0 only: without the marks,
    clipping at tp > 1 would see a part of the gradient (measured: norm 2.83 instead of 4.20).
    """
    for name, param in model.named_parameters():
        dim = next((d for suffix, d in _SHARD_DIM.items() if name.endswith(suffix)), None)
        if dim is not None and not getattr(param, "tensor_model_parallel", False):
            param.tensor_model_parallel = True
            param.partition_dim = dim
            param.partition_stride = 1


# ------------------------------------------------------------------------------------------------
# Whole-tensor conversion (global layer numbers, padded vocab on the Megatron side).
# ------------------------------------------------------------------------------------------------


def _fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dims: dict) -> torch.Tensor:
    g, d = dims["groups"], dims["head_dim"]
    per_group = dims["heads"] // g
    rest = q.shape[1:]  # (hidden,) for weights, () for biases
    q = q.reshape(g, per_group * d, *rest)
    k = k.reshape(g, d, *rest)
    v = v.reshape(g, d, *rest)
    return torch.cat([q, k, v], dim=1).reshape(-1, *rest)


def _split_qkv(qkv: torch.Tensor, dims: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g, d = dims["groups"], dims["head_dim"]
    per_group = dims["heads"] // g
    rest = qkv.shape[1:]
    grouped = qkv.reshape(g, (per_group + 2) * d, *rest)
    q, k, v = grouped.split([per_group * d, d, d], dim=1)
    return q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)


def _layer_pairs(dims: dict) -> list[tuple[str, str]]:
    """(HF suffix, Megatron suffix) of the per-layer tensors that map one-to-one."""
    pairs = [
        ("input_layernorm.weight", "input_layernorm.weight"),
        ("post_attention_layernorm.weight", "pre_mlp_layernorm.weight"),
        ("self_attn.o_proj.weight", "self_attention.linear_proj.weight"),
        ("mlp.down_proj.weight", "mlp.linear_fc2.weight"),
    ]
    if dims["qk_norm"]:
        pairs += [
            ("self_attn.q_norm.weight", "self_attention.q_layernorm.weight"),
            ("self_attn.k_norm.weight", "self_attention.k_layernorm.weight"),
        ]
    return pairs


def expected_hf_names(hf_config) -> list[str]:
    dims = model_dims(hf_config)
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    if not dims["tied"]:
        names.append("lm_head.weight")
    for i in range(dims["layers"]):
        p = f"model.layers.{i}."
        names += [p + hf for hf, _ in _layer_pairs(dims)]
        names += [p + f"self_attn.{x}_proj.weight" for x in "qkv"]
        if dims["qkv_bias"]:
            names += [p + f"self_attn.{x}_proj.bias" for x in "qkv"]
        names += [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"]
    return names


def hf_to_megatron(
    state: Mapping[str, torch.Tensor], hf_config, *, tp_size: int = 1
) -> dict[str, torch.Tensor]:
    """HF ``state_dict`` -> whole Megatron tensors. Unknown or missing names raise ``KeyError``
    (a tied ``lm_head.weight`` copy in ``state`` is accepted and ignored)."""
    dims = model_dims(hf_config)
    expected = expected_hf_names(hf_config)
    ignorable = {"lm_head.weight"} if dims["tied"] else set()
    missing = [k for k in expected if k not in state]
    unexpected = [
        k for k in state if k not in set(expected) | ignorable and not k.endswith("rotary_emb.inv_freq")
    ]
    if missing or unexpected:
        raise KeyError(
            f"not a {dims['model_type']} state dict matching its config: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}"
        )
    vocab = padded_vocab_size(dims["vocab"], tp_size)

    def pad_vocab(t: torch.Tensor) -> torch.Tensor:
        return t if t.shape[0] == vocab else torch.cat([t, t.new_zeros(vocab - t.shape[0], *t.shape[1:])])

    out = {
        "embedding.word_embeddings.weight": pad_vocab(state["model.embed_tokens.weight"]),
        "decoder.final_layernorm.weight": state["model.norm.weight"],
    }
    if not dims["tied"]:
        out["output_layer.weight"] = pad_vocab(state["lm_head.weight"])
    for i in range(dims["layers"]):
        h, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        for hf_suffix, mg_suffix in _layer_pairs(dims):
            out[m + mg_suffix] = state[h + hf_suffix]
        kinds = ("weight", "bias") if dims["qkv_bias"] else ("weight",)
        for kind in kinds:
            q, k, v = (state[f"{h}self_attn.{x}_proj.{kind}"] for x in "qkv")
            out[f"{m}self_attention.linear_qkv.{kind}"] = _fuse_qkv(q, k, v, dims)
        out[m + "mlp.linear_fc1.weight"] = torch.cat(
            [state[h + "mlp.gate_proj.weight"], state[h + "mlp.up_proj.weight"]]
        )
    return {k: v.detach().clone().contiguous() for k, v in out.items()}


def megatron_to_hf(state: Mapping[str, torch.Tensor], hf_config) -> dict[str, torch.Tensor]:
    """Whole Megatron tensors -> HF ``state_dict`` names (``lm_head.weight`` included even when tied,
    as ``model.state_dict()`` lists it)."""
    dims = model_dims(hf_config)
    v = dims["vocab"]
    embed = state["embedding.word_embeddings.weight"][:v]
    out = {"model.embed_tokens.weight": embed, "model.norm.weight": state["decoder.final_layernorm.weight"]}
    out["lm_head.weight"] = embed if dims["tied"] else state["output_layer.weight"][:v]
    for i in range(dims["layers"]):
        h, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        for hf_suffix, mg_suffix in _layer_pairs(dims):
            out[h + hf_suffix] = state[m + mg_suffix]
        kinds = ("weight", "bias") if dims["qkv_bias"] else ("weight",)
        for kind in kinds:
            q, k, vv = _split_qkv(state[f"{m}self_attention.linear_qkv.{kind}"], dims)
            out[f"{h}self_attn.q_proj.{kind}"], out[f"{h}self_attn.k_proj.{kind}"] = q, k
            out[f"{h}self_attn.v_proj.{kind}"] = vv
        gate, up = state[m + "mlp.linear_fc1.weight"].chunk(2, dim=0)
        out[h + "mlp.gate_proj.weight"], out[h + "mlp.up_proj.weight"] = gate, up
    return {k: t.detach().clone().contiguous() for k, t in out.items()}


# ------------------------------------------------------------------------------------------------
# Tensor-parallel slicing of the whole tensors.
# ------------------------------------------------------------------------------------------------

# Dim split across tp ranks (None: replicated). linear_fc1 and linear_qkv need care, see below.
_SHARD_DIM = {
    "word_embeddings.weight": 0,
    "output_layer.weight": 0,
    "linear_qkv.weight": 0,
    "linear_qkv.bias": 0,
    "linear_fc1.weight": 0,
    "linear_proj.weight": 1,
    "linear_fc2.weight": 1,
}


def tp_slice(name: str, tensor: torch.Tensor, *, tp_rank: int, tp_size: int) -> torch.Tensor:
    """This rank's part of a whole Megatron tensor.

    - ``linear_qkv``: query groups are whole on a rank, so a contiguous chunk of the per-group
      layout is exactly the rank's groups (tp must divide num_query_groups);
    - gated ``linear_fc1`` = ``[gate; up]``: each rank holds ``[gate_r; up_r]``, NOT a contiguous
      chunk of the whole tensor;
    - everything else: a contiguous chunk along the split dim, or the whole tensor if replicated.
    """
    if tp_size == 1:
        return tensor
    if name.endswith("linear_fc1.weight"):
        gate, up = tensor.chunk(2, dim=0)
        return torch.cat([gate.chunk(tp_size, dim=0)[tp_rank], up.chunk(tp_size, dim=0)[tp_rank]])
    for suffix, dim in _SHARD_DIM.items():
        if name.endswith(suffix):
            return tensor.chunk(tp_size, dim=dim)[tp_rank]
    return tensor


def tp_unslice(name: str, parts: list[torch.Tensor]) -> torch.Tensor:
    """Inverse of ``tp_slice``: the whole tensor from every rank's part (in tp-rank order)."""
    if len(parts) == 1:
        return parts[0]
    if name.endswith("linear_fc1.weight"):
        gates, ups = zip(*(p.chunk(2, dim=0) for p in parts))
        return torch.cat([*gates, *ups])
    for suffix, dim in _SHARD_DIM.items():
        if name.endswith(suffix):
            return torch.cat(parts, dim=dim)
    return parts[0]


# ------------------------------------------------------------------------------------------------
# One rank's module state <-> HF state dict (what a Megatron backend calls).
# ------------------------------------------------------------------------------------------------


def _renumber_layer(name: str, offset: int) -> str:
    """``decoder.layers.{i}.`` -> ``decoder.layers.{i + offset}.`` (pipeline stages number locally)."""
    prefix = "decoder.layers."
    if not name.startswith(prefix) or offset == 0:
        return name
    index, rest = name[len(prefix) :].split(".", 1)
    return f"{prefix}{int(index) + offset}.{rest}"


def load_hf_state_into(
    targets: Mapping[str, torch.Tensor],
    hf_state: Mapping[str, torch.Tensor],
    hf_config,
    *,
    tp_rank: int = 0,
    tp_size: int = 1,
    layer_offset: int = 0,
) -> None:
    """Copy an HF ``state_dict`` into this rank's Megatron tensors ``targets`` (module ``state_dict``
    names, local layer numbers; ``_extra_state`` entries are skipped), in place.

    A pipeline last stage with tied embeddings holds ``output_layer.weight`` as its copy of the
    embedding: it gets the embedding's rows."""
    full = hf_to_megatron(hf_state, hf_config, tp_size=tp_size)
    tied = model_dims(hf_config)["tied"]
    used: set[str] = set()
    with torch.no_grad():
        for name, target in targets.items():
            if name.endswith("_extra_state"):
                continue
            source = _renumber_layer(name, layer_offset)
            if source == "output_layer.weight" and source not in full:
                source = "embedding.word_embeddings.weight"
            if source not in full:
                raise KeyError(f"no HF tensor maps to Megatron parameter {name!r} (global name {source!r})")
            part = tp_slice(source, full[source], tp_rank=tp_rank, tp_size=tp_size)
            if part.shape != target.shape:
                raise ValueError(
                    f"{name}: converted shard {tuple(part.shape)} != parameter {tuple(target.shape)}"
                )
            target.copy_(part)
            used.add(source)
    # Every converted tensor of this rank's layers must have found a parameter: one left over means
    # the Megatron model lacks a part of the HF model (e.g. built without qk_layernorm).
    local_layers = {
        _renumber_layer(n, layer_offset).split(".")[2] for n in targets if n.startswith("decoder.layers.")
    }
    unused = [
        k
        for k in full
        if k not in used
        and (k.split(".")[2] in local_layers if k.startswith("decoder.layers.") else _stage_holds(k, targets, tied=tied))
    ]
    if unused:
        raise KeyError(f"converted HF tensors without a Megatron parameter on this rank: {unused[:5]}")


def _stage_holds(name: str, targets: Mapping[str, torch.Tensor], *, tied: bool) -> bool:
    """Does this pipeline stage hold the non-layer tensor ``name`` (embedding: first stage, and the
    last stage's output layer when it is tied to it; final norm and output layer: last stage)?"""
    return name in targets or (
        tied and name == "embedding.word_embeddings.weight" and "output_layer.weight" in targets
    )


def gather_hf_state(
    local: Mapping[str, torch.Tensor], hf_config, *, tp_group=None, pp_group=None, layer_offset: int = 0
) -> dict[str, torch.Tensor]:
    """The whole model as an HF ``state_dict`` on the CPU, from every rank's Megatron tensors (on its
    device; a collective over the tensor- and pipeline-parallel groups; without groups, ``local`` is
    the whole model)."""
    import torch.distributed as dist

    tp_size = dist.get_world_size(tp_group) if tp_group is not None else 1
    tied = model_dims(hf_config)["tied"]
    mine: dict[str, torch.Tensor] = {}
    for name, tensor in local.items():
        if name.endswith("_extra_state") or (tied and name == "output_layer.weight"):
            continue  # a tied output layer is a synced copy of the embedding
        tensor = tensor.detach().contiguous()
        if tp_size > 1 and any(name.endswith(s) for s in _SHARD_DIM):
            parts = [torch.empty_like(tensor) for _ in range(tp_size)]
            dist.all_gather(parts, tensor, group=tp_group)
            tensor = tp_unslice(name, parts)
        # whole weights leave the rank as CPU tensors (also what the pipeline stages exchange)
        mine[_renumber_layer(name, layer_offset)] = tensor.to("cpu", copy=True)
    if pp_group is not None and dist.get_world_size(pp_group) > 1:
        stages: list = [None] * dist.get_world_size(pp_group)
        dist.all_gather_object(stages, mine, group=pp_group)
        mine = {k: v for stage in stages for k, v in stage.items()}
    return megatron_to_hf(mine, hf_config)
