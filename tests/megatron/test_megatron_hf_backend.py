"""``MegatronBackend.for_policy`` on a Hugging Face checkpoint (what ``relax train --backend megatron
--hf-checkpoint`` builds on every actor rank), against the torch backend on the same checkpoint.

The checkpoints are random, built at test time, with norm weights away from 1 and an odd vocabulary
(47: tensor parallelism pads it to 48): a Qwen3 with tied embeddings (q/k RMSNorm; under pipeline
parallelism the last stage holds a synced copy of the embedding) and a Llama with an untied output
layer (the last stage holds its own). Megatron runs in spawned gloo ranks.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

pytestmark = [
    pytest.mark.megatron,
    pytest.mark.skipif(importlib.util.find_spec("megatron.core") is None, reason="megatron-core is not installed"),
    pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="the hf extra is not installed"),
]

import hf_backend_workers as W  # noqa: E402
from megatron_harness import run_distributed  # noqa: E402

VOCAB = 47
# Float32 noise between two attention / RoPE implementations (HF sdpa vs Megatron's local spec):
# measured max |diff| of the log-probs 3.3e-6, of the entropy 1.9e-6 (logits agree within 3e-5,
# tests/hf/test_megatron_convert.py).
LOGPROB_ATOL = 2e-5
# After STEPS Adam steps at lr 1e-2 on both sides (measured max |diff|: loss 3e-7, weights 2.2e-6;
# gradient norm 3.2e-6 relative).
WEIGHT_ATOL = 2e-5


@pytest.fixture(scope="module", params=[("qwen3", True), ("llama", False)], ids=["qwen3-tied", "llama"])
def checkpoint(request, tmp_path_factory) -> str:
    from transformers import AutoModelForCausalLM

    from relax.models.hf.tiny_random import model_config

    family, tie = request.param
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(model_config(family, VOCAB, tie=tie, hidden=64, layers=2))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # norms away from 1, so a swapped or dropped norm cannot pass
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2 + (1.0 if p.dim() == 1 else 0.0))
    path = tmp_path_factory.mktemp("hf") / family
    model.save_pretrained(str(path))
    return str(path)


@pytest.fixture(scope="module")
def reference(checkpoint):
    return W.torch_reference(checkpoint, VOCAB)


@pytest.fixture(scope="module")
def tp1(checkpoint, reference):
    return run_distributed(W.single_rank, 1, checkpoint, VOCAB, reference["old"])[0]


@pytest.fixture(scope="module")
def world2(checkpoint, reference, tp1):
    return run_distributed(W.two_ranks, 2, checkpoint, VOCAB, reference["old"], tp1["state"])


def _max_diff(a: dict, b: dict) -> float:
    assert set(a) == set(b), set(a) ^ set(b)
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _follows_torch(run: dict, reference: dict) -> None:
    assert float((run["log_probs"] - reference["log_probs"]).abs().max()) < LOGPROB_ATOL
    assert float((run["entropy"] - reference["entropy"]).abs().max()) < LOGPROB_ATOL
    assert float(reference["log_probs"].abs().max()) > 1.0  # not a comparison of near-zero numbers
    for mg, pt in zip(run["metrics"], reference["metrics"], strict=True):
        assert mg["loss"] == pytest.approx(pt["loss"], abs=1e-5)
        assert mg["grad_norm"] == pytest.approx(pt["grad_norm"], rel=1e-4)
        assert mg["pg_clipfrac"] == pytest.approx(pt["pg_clipfrac"], abs=1e-6)
    assert reference["metrics"][0]["grad_norm"] > 1.0  # clipping at 1.0 engaged, so it is compared too
    assert _max_diff(run["trained"], reference["trained"]) < WEIGHT_ATOL
    assert _max_diff(reference["trained"], reference["initial"]) > 1e-3  # the steps moved the weights


@pytest.mark.timeout(240)
def test_export_after_loading_is_the_checkpoint_exactly(tp1, world2, reference):
    """Zero steps: the HF weights through the converter, the shards and the gather come back bit for
    bit, in the HF module's own state_dict names (lm_head.weight included, as a tied model lists it)."""
    for run in (tp1, world2[0]["tp2"], world2[1]["tp2"], world2[0]["pp2"], world2[1]["pp2"]):
        assert _max_diff(run["exported_initial"], reference["initial"]) == 0.0
        assert run["released"]  # the rank keeps its shard only, not the whole HF model it loaded


@pytest.mark.timeout(240)
def test_tp1_log_probs_and_training_follow_the_torch_backend(tp1, reference):
    assert tp1["sizes"] == (1, 1, 1)
    _follows_torch(tp1, reference)


@pytest.mark.timeout(300)
def test_tp2_and_pp2_follow_the_torch_backend(world2, reference):
    for rank in world2:
        assert rank["tp2"]["sizes"] == (2, 1, 1) and rank["pp2"]["sizes"] == (1, 2, 1)
        _follows_torch(rank["tp2"], reference)
        _follows_torch(rank["pp2"], reference)


@pytest.mark.timeout(300)
def test_hf_checkpoint_state_is_layout_free(tp1, world2):
    """A TP = 1 state (HF naming) loaded on TP = 2 comes back out of the shards unchanged."""
    for rank in world2:
        reloaded = rank["tp2"]["reloaded"]
        assert reloaded["model_config"] == tp1["state"]["model_config"]
        for part in ("model", "exp_avg", "exp_avg_sq"):
            assert _max_diff(reloaded[part], tp1["state"][part]) == 0.0, part
        assert reloaded["adam_step"] == tp1["state"]["adam_step"] == W.STEPS
        assert float(tp1["state"]["exp_avg_sq"]["model.layers.0.mlp.up_proj.weight"].abs().max()) > 0
