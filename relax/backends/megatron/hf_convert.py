"""Hugging Face Llama / Qwen2 / Qwen3 (dense) weights <-> Megatron ``GPTModel`` weights, both ways.

The model itself is built by ``hf_model`` (``hf_transformer_config``, ``build_hf_gpt_model``). Its
weights: ``hf_to_megatron(hf_state, hf_config)`` gives them as whole tensors and
``tp_slices.tp_slice(...)`` this rank's tensor-parallel slice (``load_hf_state_into`` does both for one
rank's module). ``megatron_to_hf`` reverses it (``gather_hf_state`` over the ranks), so a trained
Megatron model is saved with ``save_pretrained`` like any other. ``MegatronBackend`` uses it through
``relax.backends.megatron.families.HFFamily`` for ``--backend megatron --hf-checkpoint``
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

Rotary embeddings need no weights (see ``hf_model``).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from relax.backends.megatron.hf_model import model_dims, padded_vocab_size
from relax.backends.megatron.tp_slices import SHARD_DIM, tp_slice, tp_unslice

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
        if tp_size > 1 and any(name.endswith(s) for s in SHARD_DIM):
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
