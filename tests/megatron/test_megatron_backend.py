"""The Megatron backend against independent references, in spawned gloo ranks.

References: the plain-torch ``TinyCausalLM`` (logits, log-probs, entropy, autograd gradients), the
``TorchBackend`` (training trajectory), the TP=1 run (for TP=2, PP=2 and resumed checkpoints), and
the single-process ``compute_advantages`` (for advantages on the data-parallel ranks).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

pytestmark = [
    pytest.mark.megatron,
    pytest.mark.skipif(importlib.util.find_spec("megatron.core") is None, reason="megatron-core is not installed"),
]

from megatron_harness import run_distributed  # noqa: E402
import megatron_workers as W  # noqa: E402

ATOL = 2e-6  # float32 reduction-order noise between layouts / implementations


def _max_diff(a: dict, b: dict) -> float:
    assert set(a) == set(b), set(a) ^ set(b)
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.fixture(scope="module")
def tp1():
    return run_distributed(W.single_rank_reference, 1)[0]


@pytest.fixture(scope="module")
def world2(tp1):
    return run_distributed(W.two_ranks, 2, tp1["checkpoint"], tp1["old"])


@pytest.mark.timeout(180)
def test_megatron_matches_tiny_causal_lm(tp1):
    batch = W.make_batch()
    valid = batch.attention_mask  # padded query positions are never read
    diff = (tp1["logits"] - tp1["ref_logits"]).abs()[valid]
    assert float(diff.max()) < ATOL
    assert float((tp1["log_probs"] - tp1["ref_log_probs"]).abs().max()) < ATOL
    assert float((tp1["entropy"] - tp1["ref_entropy"]).abs().max()) < ATOL
    # masked response positions are exactly zero, like the torch backend
    assert torch.all(tp1["log_probs"][~batch.response_mask] == 0)


@pytest.mark.timeout(180)
def test_conversion_round_trip_is_exact(tp1):
    assert _max_diff(tp1["exported_initial"], tp1["weights"]) == 0.0


@pytest.mark.timeout(180)
def test_conversion_functions_round_trip_with_padded_vocab():
    from relax.backends.megatron.model import megatron_to_tiny, padded_vocab_size, tiny_to_megatron

    weights = W.initial_weights()
    for tp in (1, 2, 4):
        full = tiny_to_megatron(weights, W.CFG, tp_size=tp)
        assert full["embedding.word_embeddings.weight"].shape[0] == padded_vocab_size(17, tp)
        assert _max_diff(megatron_to_tiny(full, W.CFG), weights) == 0.0
    # the fused qkv groups rows per head: [q_h; k_h; v_h]
    qkv = tiny_to_megatron(weights, W.CFG)["decoder.layers.1.self_attention.linear_qkv.weight"]
    hd = W.CFG.d_model // W.CFG.n_heads
    assert torch.equal(qkv[3 * hd : 4 * hd], weights["blocks.1.attn.q_proj.weight"][hd : 2 * hd])
    assert torch.equal(qkv[4 * hd : 5 * hd], weights["blocks.1.attn.k_proj.weight"][hd : 2 * hd])
    assert torch.equal(qkv[5 * hd : 6 * hd], weights["blocks.1.attn.v_proj.weight"][hd : 2 * hd])
    with pytest.raises(KeyError, match="missing"):
        tiny_to_megatron({k: v for k, v in weights.items() if k != "ln_f.bias"}, W.CFG)


@pytest.mark.timeout(180)
def test_megatron_training_matches_torch_backend(tp1):
    for mg, pt in zip(tp1["metrics"], tp1["torch_metrics"]):
        assert mg["loss"] == pytest.approx(pt["loss"], abs=1e-6)
        assert mg["grad_norm"] == pytest.approx(pt["grad_norm"], rel=1e-5)
        assert mg["entropy"] == pytest.approx(pt["entropy"], abs=1e-6)
    assert tp1["metrics"][0]["grad_norm"] > 1.0  # clipping at 1.0 engaged, so it is compared too
    assert _max_diff(tp1["trained"], tp1["torch_trained"]) < 1e-5
    assert _max_diff(tp1["trained"], tp1["weights"]) > 1e-3  # the steps did move the weights


@pytest.mark.timeout(180)
def test_checkpoint_resume_is_exact(tp1):
    assert tp1["resumed_step"] == tp1["next_step"]
    assert _max_diff(tp1["after_resumed"], tp1["after_next"]) == 0.0
    assert tp1["checkpoint"]["adam_step"] == W.STEPS


@pytest.mark.timeout(300)
def test_tp2_equals_tp1(tp1, world2):
    for rank in world2:
        assert rank["tp_sizes"] == (2, 1, 1)
        batch = W.make_batch()
        valid = batch.attention_mask
        assert float((rank["logits"] - tp1["logits"]).abs()[valid].max()) < ATOL
        assert float((rank["log_probs"] - tp1["log_probs"]).abs().max()) < ATOL
        assert float((rank["entropy"] - tp1["entropy"]).abs().max()) < ATOL
        for a, b in zip(rank["metrics"], tp1["metrics"]):
            assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)
            assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5)
        assert _max_diff(rank["trained"], tp1["trained"]) < 1e-5
        # a checkpoint written at TP=1 resumes at TP=2 to the same next step
        assert rank["resumed_step"]["loss"] == pytest.approx(tp1["resumed_step"]["loss"], abs=1e-6)
        assert rank["resumed_step"]["grad_norm"] == pytest.approx(tp1["resumed_step"]["grad_norm"], rel=1e-5)
        assert _max_diff(rank["after_resumed"], tp1["after_resumed"]) < 1e-5


@pytest.mark.timeout(300)
def test_dp2_gradients(world2):
    for rank in world2:
        assert rank["dp_sizes"] == (1, 2, 1)
        per_rank = rank["per_rank_grads"]
        mean = {k: (per_rank[0][k] + per_rank[1][k]) / 2 for k in per_rank[0]}
        total = {k: per_rank[0][k] + per_rank[1][k] for k in per_rank[0]}
        assert _max_diff(rank["dp_mean_grads"], mean) < 1e-6
        assert _max_diff(rank["dp_sum_grads"], total) < 1e-6
        # with global token normalization, the summed shards give the whole-batch gradient
        assert _max_diff(rank["dp_sum_grads"], rank["full_batch_grads"]) < 1e-6
        assert max(float(v.abs().max()) for v in per_rank[1].values()) > 1e-3


@pytest.mark.timeout(300)
def test_pp2_equals_tp1(tp1, world2):
    for rank in world2:
        assert rank["pp_sizes"] == (1, 1, 2)
        run = rank["pp_run"]
        assert float((run["log_probs"] - tp1["log_probs"]).abs().max()) < ATOL
        for a, b in zip(run["metrics"], tp1["metrics"]):
            assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)
            assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5)
        assert _max_diff(rank["pp_trained"], tp1["trained"]) < 1e-5


@pytest.mark.timeout(300)
def test_gdpo_advantages_on_actor_equal_single_process(world2):
    from relax.algorithms.types import AdvantageInputs

    algorithm, rewards, mask = W.gdpo_rollout()
    expected, expected_returns = algorithm.compute_advantages(
        AdvantageInputs(rewards=rewards, response_mask=mask, segment_sizes=W.GDPO_SEGMENTS)
    )
    got = torch.zeros_like(expected)
    got_returns = torch.zeros_like(expected)
    seen = []
    for rank in world2:
        part = rank["advantages"]
        got[part["rows"]] = part["advantages"]
        got_returns[part["rows"]] = part["returns"]
        seen += part["rows"]
    assert sorted(seen) == list(range(16))
    assert [r["advantages"]["segment_sizes"] for r in world2] == [(3, 3, 1, 2), (3, 2, 0, 2)]
    assert float((got - expected).abs().max()) < 1e-6
    assert float((got_returns - expected_returns).abs().max()) < 1e-6
    assert float(expected.abs().max()) > 0.5  # non-trivial advantages


@pytest.mark.timeout(180)
def test_optimizer_flags_follow_the_torch_backend():
    """--weight-decay (biases and norms exempt), --adam-*, and the warm-up + cosine schedule act
    alike on both backends: same learning rates, same trajectory."""
    import math

    from relax.backends.optim import decays

    out = run_distributed(W.optimizer_flags, 1)[0]
    # warm-up 1 step of 4, then cosine from 1e-2 to 1e-3 over 3 steps: progress 0, 1/3, 2/3
    expected = [W.LR] + [1e-3 + (W.LR - 1e-3) * (1 + math.cos(math.pi * k / 3)) / 2 for k in range(3)]
    assert [m["lr"] for m in out["megatron"]] == pytest.approx(expected)
    assert [m["lr"] for m in out["torch"]] == pytest.approx(expected)
    for mg, pt in zip(out["megatron"], out["torch"]):
        assert mg["loss"] == pytest.approx(pt["loss"], abs=1e-6)
    assert _max_diff(out["megatron_trained"], out["torch_trained"]) < 1e-5
    # zero gradient: decayed weights shrink by (1 - lr * wd), biases and LayerNorm parameters stay
    initial = W.initial_weights()
    for name, value in out["decayed"].items():
        factor = 1 - 0.1 * 0.5 if decays(name, value) else 1.0
        torch.testing.assert_close(value, initial[name] * factor, rtol=0, atol=1e-7, msg=name)


@pytest.mark.timeout(180)
def test_recompute_activations_gives_the_same_training():
    out = run_distributed(W.recompute, 1)[0]
    assert out["checkpointed_calls"] == W.STEPS * 3  # one checkpointed pass per micro-batch of each step
    for a, b in zip(out["recompute"], out["plain"]):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-7) and a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-6)
    assert _max_diff(out["recompute_trained"], out["plain_trained"]) < 1e-6
