"""HF Llama / Qwen2 / Qwen3 <-> Megatron GPTModel: logits equality and exact weight round trips,
at tp=1 and tp=2 (spawned gloo ranks: Megatron keeps process-global state)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.megatron,
    pytest.mark.skipif(
        importlib.util.find_spec("megatron.core") is None, reason="megatron-core is not installed"
    ),
]

sys.path.insert(0, str(Path(__file__).parents[1] / "megatron"))
sys.path.insert(0, str(Path(__file__).parent))
import megatron_convert_workers as W
from megatron_harness import run_distributed

ATOL = 3e-5  # float32 noise between two attention / RoPE implementations, logits of magnitude ~10

TP1_CASES = [(f, tie) for f in ("llama", "qwen2", "qwen3") for tie in (False, True)]
TP2_CASES = [("qwen2", False), ("qwen3", True)]


def check(results):
    for case, r in results.items():
        valid = r["mask"]  # padded query positions are never read
        diff = (r["megatron"] - r["ref"]).abs()[valid].max()
        assert float(diff) < ATOL, (case, float(diff))
        assert float(r["ref"].abs().max()) > 1.0  # the comparison is not between near-zero logits
        hf, back = r["hf_state"], r["round_trip"]
        assert set(back) == set(hf), (case, set(back) ^ set(hf))
        for name in hf:
            assert torch.equal(back[name], hf[name]), (case, name)


@pytest.mark.timeout(240)
def test_hf_megatron_logits_and_round_trip_tp1():
    check(run_distributed(W.convert_and_compare, 1, TP1_CASES)[0])


@pytest.mark.timeout(240)
def test_hf_megatron_logits_and_round_trip_tp2():
    ranks = run_distributed(W.convert_and_compare, 2, TP2_CASES)
    check(ranks[0])
    check(ranks[1])


def test_tp_slice_of_gated_fc1_keeps_gate_and_up_together():
    from relax.backends.megatron.hf_convert import tp_slice, tp_unslice

    gate = torch.arange(8.0).reshape(4, 2)
    up = 100 + torch.arange(8.0).reshape(4, 2)
    fc1 = torch.cat([gate, up])
    parts = [tp_slice("decoder.layers.0.mlp.linear_fc1.weight", fc1, tp_rank=r, tp_size=2) for r in range(2)]
    assert torch.equal(parts[0], torch.cat([gate[:2], up[:2]]))
    assert torch.equal(parts[1], torch.cat([gate[2:], up[2:]]))
    assert torch.equal(tp_unslice("decoder.layers.0.mlp.linear_fc1.weight", parts), fc1)


def test_unsupported_configs_are_rejected():
    from transformers import LlamaConfig, MistralConfig

    from relax.backends.megatron.hf_convert import hf_to_megatron

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
    with pytest.raises(KeyError, match="missing"):
        hf_to_megatron(
            {},
            LlamaConfig(
                num_hidden_layers=1, hidden_size=8, num_attention_heads=2, intermediate_size=16, vocab_size=10
            ),
        )
