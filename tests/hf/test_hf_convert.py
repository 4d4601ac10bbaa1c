"""HF <-> Megatron name/layout conversion without megatron-core (pure tensor bookkeeping): exact round
trips, tensor-parallel slicing, pipeline layer offsets, and the errors. The numerical check against
a real GPTModel is ``test_megatron_convert.py`` (megatron environment)."""

import sys
from pathlib import Path

import pytest
import torch

from relax.backends.megatron.hf_convert import hf_to_megatron, load_hf_state_into, megatron_to_hf
from relax.backends.megatron.tp_slices import tp_slice, tp_unslice

sys.path.insert(0, str(Path(__file__).parent))
from megatron_convert_workers import random_hf_model


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("tp", [1, 2])
def test_round_trip_is_exact(family, tie, tp):
    cfg, model = random_hf_model(family, tie)
    state = model.state_dict()
    full = hf_to_megatron(state, cfg, tp_size=tp)
    assert full["embedding.word_embeddings.weight"].shape[0] % tp == 0
    assert ("output_layer.weight" in full) is not tie
    # Through tp shards and back.
    shards = {k: [tp_slice(k, v, tp_rank=r, tp_size=tp) for r in range(tp)] for k, v in full.items()}
    back = megatron_to_hf({k: tp_unslice(k, parts) for k, parts in shards.items()}, cfg)
    assert set(back) == set(state)
    for name in state:
        assert torch.equal(back[name], state[name]), name


def test_qkv_is_grouped_per_query_group():
    cfg, model = random_hf_model("qwen2", False)  # 4 heads, 2 kv groups, head dim 32, qkv bias
    s = model.state_dict()
    qkv = hf_to_megatron(s, cfg)["decoder.layers.0.self_attention.linear_qkv.bias"]
    q, k, v = (s[f"model.layers.0.self_attn.{x}_proj.bias"] for x in "qkv")
    d = 32
    # group 0: q heads 0-1, k_0, v_0; group 1: q heads 2-3, k_1, v_1
    expected = torch.cat([q[: 2 * d], k[:d], v[:d], q[2 * d :], k[d:], v[d:]])
    assert torch.equal(qkv, expected)


def test_tp_slice_of_gated_fc1_keeps_gate_and_up_together():
    gate = torch.arange(8.0).reshape(4, 2)
    up = 100 + torch.arange(8.0).reshape(4, 2)
    fc1 = torch.cat([gate, up])
    name = "decoder.layers.0.mlp.linear_fc1.weight"
    parts = [tp_slice(name, fc1, tp_rank=r, tp_size=2) for r in range(2)]
    assert torch.equal(parts[0], torch.cat([gate[:2], up[:2]]))
    assert torch.equal(parts[1], torch.cat([gate[2:], up[2:]]))
    assert torch.equal(tp_unslice(name, parts), fc1)


def test_load_into_a_pipeline_stage_renumbers_layers():
    cfg, model = random_hf_model("qwen3", True)
    full = hf_to_megatron(model.state_dict(), cfg)
    # The last of two stages: global layer 1 is its local layer 0; tied output layer copy.
    targets = {
        k.replace("decoder.layers.1.", "decoder.layers.0."): torch.zeros_like(v)
        for k, v in full.items()
        if k.startswith("decoder.layers.1.")
    }
    targets["decoder.final_layernorm.weight"] = torch.zeros_like(full["decoder.final_layernorm.weight"])
    targets["output_layer.weight"] = torch.zeros_like(full["embedding.word_embeddings.weight"])
    load_hf_state_into(targets, model.state_dict(), cfg, layer_offset=1)
    for name, value in targets.items():
        source = name.replace("decoder.layers.0.", "decoder.layers.1.")
        source = "embedding.word_embeddings.weight" if source == "output_layer.weight" else source
        assert torch.equal(value, full[source]), name


def test_load_reports_parts_the_megatron_model_lacks():
    cfg, model = random_hf_model("qwen3", False)
    full = hf_to_megatron(model.state_dict(), cfg)
    targets = {k: torch.zeros_like(v) for k, v in full.items() if "q_layernorm" not in k}
    with pytest.raises(KeyError, match="without a Megatron parameter.*q_layernorm"):
        load_hf_state_into(targets, model.state_dict(), cfg)


def test_unsupported_configs_are_rejected():
    from transformers import LlamaConfig, MistralConfig

    with pytest.raises(ValueError, match="model_type='mistral'"):
        hf_to_megatron({}, MistralConfig())
    scaled = LlamaConfig(
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        }
    )
    with pytest.raises(ValueError, match="rope_scaling"):
        hf_to_megatron({}, scaled)
    small = LlamaConfig(
        num_hidden_layers=1, hidden_size=8, num_attention_heads=2, intermediate_size=16, vocab_size=10
    )
    with pytest.raises(KeyError, match="missing"):
        hf_to_megatron({}, small)
