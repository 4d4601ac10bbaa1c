"""``--bf16`` (autocast over float32 master weights) and ``--recompute-activations`` (block-level
activation checkpointing) in TorchBackend, on the built-in model, a transformers model and a critic."""

from __future__ import annotations

import pytest
import torch
from test_torch_backend import advantages_for, make_batch, make_model, weighted_loss

from relax.backends.torch_backend import TorchBackend
from relax.backends.torch_setup import enable_recompute
from relax.config.run import RunConfig
from relax.models.value import ValueModel


def _loss(batch):
    return weighted_loss(batch, advantages_for(batch), float(batch.response_mask.sum()))


def _output_dtypes(module) -> list:
    dtypes = []
    module.register_forward_hook(lambda m, args, out: dtypes.append(out.dtype))
    return dtypes


def _count_calls(module) -> list:
    """Calls of ``module`` (a pre-hook: the recomputation stops early, once the backward pass has
    every tensor it needs, so a block's post-forward hook would not see it)."""
    calls = []
    module.register_forward_pre_hook(lambda m, args: calls.append(1))
    return calls


def test_bf16_computes_in_bfloat16_and_keeps_float32_weights_and_adam_state():
    batch = make_batch()
    fp32 = TorchBackend(make_model())
    bf16 = TorchBackend.for_policy(RunConfig(bf16=True), make_model())
    assert bf16.bf16 and not fp32.bf16
    calls = _output_dtypes(bf16.model.blocks[0].mlp.fc_in)
    lp16 = bf16.compute_log_probs(batch).log_probs
    lp32 = fp32.compute_log_probs(batch).log_probs
    assert calls == [torch.bfloat16]  # the matmuls ran in bfloat16
    assert lp16.dtype == torch.float32  # log-softmax in float32
    diff = float((lp16 - lp32).abs().max())
    assert 0 < diff < 0.1, diff  # bf16 rounding (8 bits of mantissa), not a different model
    metrics = bf16.train_step(batch, _loss(batch))
    assert calls[-1] == torch.bfloat16 and metrics["grad_norm"] > 0
    assert all(p.dtype == torch.float32 for p in bf16.model.parameters())
    assert all(p.grad.dtype == torch.float32 for p in bf16.model.parameters())
    state = bf16.optimizer.state[bf16.model.tok_emb.weight]
    assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.float32
    assert all(v.dtype == torch.float32 for v in bf16.export_weights().values())


def test_recompute_runs_each_block_twice_and_gives_the_same_step():
    batch = make_batch()
    plain = TorchBackend(make_model(), lr=1e-2)
    recomputed = TorchBackend.for_policy(RunConfig(lr=1e-2, recompute_activations=True), make_model())
    assert recomputed.model.gradient_checkpointing and not plain.model.gradient_checkpointing
    calls = _count_calls(recomputed.model.blocks[1])
    recomputed.compute_log_probs(batch)  # no gradients: no checkpointing
    assert len(calls) == 1
    m_re = recomputed.train_step(batch, _loss(batch))
    assert len(calls) == 3  # forward + recomputation in the backward pass
    m_plain = plain.train_step(batch, _loss(batch))
    assert m_re["loss"] == m_plain["loss"] and m_re["grad_norm"] == m_plain["grad_norm"]
    for (k, a), b in zip(recomputed.export_weights().items(), plain.export_weights().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-7, msg=k)


def test_recompute_on_the_critic_value_model():
    batch = make_batch()
    config = RunConfig(recompute_activations=True)
    critic = TorchBackend.for_critic(config, ValueModel(make_model()))
    calls = _count_calls(critic.model.trunk.blocks[0])

    def value_loss(tv, rows):
        from relax.algorithms.types import PolicyLossOutput

        return PolicyLossOutput(loss=((tv.values - 1.0) ** 2 * batch.response_mask[rows]).sum(), metrics={})

    critic.train_step(batch, value_loss)
    assert len(calls) == 2


def test_recompute_and_bf16_on_a_transformers_model():
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM

    from relax.models.hf.adapter import hf_forward_logits
    from relax.models.hf.tiny_random import model_config

    def model():
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(model_config("qwen3", 32, hidden=32, layers=2)).eval()

    batch = make_batch()  # token ids < 17 < vocab 32
    plain = TorchBackend(model(), lr=1e-2, forward_logits=hf_forward_logits)
    m = model()
    enable_recompute(m)
    assert getattr(m, "is_activation_checkpointing", None) or m.is_gradient_checkpointing
    recomputed = TorchBackend(m, lr=1e-2, forward_logits=hf_forward_logits)
    calls = _count_calls(m.model.layers[0].mlp)
    recomputed.train_step(batch, _loss(batch))
    assert len(calls) == 2
    plain.train_step(batch, _loss(batch))
    for (k, a), b in zip(recomputed.export_weights().items(), plain.export_weights().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-7, msg=k)
    bf16 = TorchBackend(model(), forward_logits=hf_forward_logits, bf16=True)
    calls = _output_dtypes(bf16.model.model.layers[0].mlp)
    lp = bf16.compute_log_probs(batch).log_probs
    assert calls == [torch.bfloat16] and lp.dtype == torch.float32
