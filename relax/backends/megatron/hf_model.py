"""The Megatron ``GPTModel`` shaped like a Hugging Face Llama / Qwen2 / Qwen3 (dense) config.

``model_dims`` reads the shapes and options of a supported config, ``checkpoint_errors`` refuses an
unsupported checkpoint or tensor/pipeline layout from its ``config.json`` alone (before Ray starts, without
megatron-core), and ``hf_transformer_config`` / ``build_hf_gpt_model`` build the matching model: local
spec, RMSNorm, SwiGLU, RoPE, grouped-query attention, Qwen2's qkv bias, Qwen3's q/k RMSNorm. Its weights
come from the checkpoint through ``hf_convert`` (see ``docs/en/real-models.md``).

Rotary embeddings need no weights: both sides use the non-interleaved ("rotate half") layout with
``rotary_base = rope_theta`` over the full head dim. Only the default RoPE is supported; a config
with ``rope_scaling`` (Llama 3.1 "llama3", YaRN, ...) is rejected rather than silently mis-converted.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F

from relax.backends.megatron.tp_slices import SHARD_DIM

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
        dim = next((d for suffix, d in SHARD_DIM.items() if name.endswith(suffix)), None)
        if dim is not None and not getattr(param, "tensor_model_parallel", False):
            param.tensor_model_parallel = True
            param.partition_dim = dim
            param.partition_stride = 1

