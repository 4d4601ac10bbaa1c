"""Optimizer settings shared by the backends (relax/backends/optim.py) and their use in TorchBackend:
learning-rate schedules against hand-computed values, which parameters are exempt from weight decay,
Adam flags, the default staying bit-identical, and resume across groupings."""

from __future__ import annotations

import math

import attrs
import pytest
import torch

from relax.algorithms.types import PolicyLossOutput
from relax.backends import optim
from relax.backends.torch_backend import TorchBackend

config_errors = TorchBackend.config_errors
from relax.config.run import RunConfig
from test_torch_backend import advantages_for, make_batch, make_model, weighted_loss

# -- schedules -------------------------------------------------------------------------------------


def _lrs(schedule, n):
    return [schedule.lr(s) for s in range(n)]


def test_constant_schedule_with_warm_up():
    s = optim.LRSchedule(peak=1.0, warmup_steps=4, decay_style="constant", total_steps=10)
    assert _lrs(s, 6) == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 1.0])
    assert not s.is_constant
    assert optim.LRSchedule(peak=2e-3, total_steps=10).is_constant
    assert optim.LRSchedule(peak=2e-3, total_steps=10).lr(7) == 2e-3


def test_linear_decay_after_warm_up_reaches_min_lr_at_the_end():
    # warm-up 2 of 6 steps; decay over the remaining 4: progress (s - 2) / 4
    s = optim.LRSchedule(peak=1.0, min_lr=0.1, warmup_steps=2, decay_style="linear", total_steps=6)
    assert _lrs(s, 8) == pytest.approx([0.5, 1.0, 1.0, 0.775, 0.55, 0.325, 0.1, 0.1])


def test_cosine_decay_hand_values():
    s = optim.LRSchedule(peak=1.0, min_lr=0.1, warmup_steps=2, decay_style="cosine", total_steps=6)
    c = math.cos
    expected = [0.5, 1.0, 1.0, 0.1 + 0.9 * (1 + c(math.pi / 4)) / 2, 0.55, 0.1 + 0.9 * (1 + c(3 * math.pi / 4)) / 2, 0.1]
    assert _lrs(s, 7) == pytest.approx(expected)
    assert s.lr(3) == pytest.approx(0.868198, abs=1e-6)
    # no warm-up: the first step runs at the peak
    s0 = optim.LRSchedule(peak=3e-4, decay_style="cosine", total_steps=4)
    assert _lrs(s0, 4) == pytest.approx([3e-4, 3e-4 * (1 + c(math.pi / 4)) / 2, 1.5e-4, 3e-4 * (1 + c(3 * math.pi / 4)) / 2])


def test_schedule_rejects_bad_settings():
    with pytest.raises(ValueError, match="--lr-decay-style"):
        optim.LRSchedule(peak=1.0, decay_style="step")
    with pytest.raises(ValueError, match="--min-lr"):
        optim.LRSchedule(peak=1.0, min_lr=2.0, decay_style="linear")


def test_schedule_of_a_run_decays_over_num_rollout_times_steps_per_rollout():
    config = RunConfig(num_rollout=5, num_steps_per_rollout=2, lr=1e-3, min_lr=1e-4, lr_warmup_steps=2,
                       lr_decay_style="linear")
    s = optim.lr_schedule(config)
    assert (s.total_steps, s.warmup_steps, s.peak, s.min_lr) == (10, 2, 1e-3, 1e-4)
    critic = optim.lr_schedule(config, peak=config.critic_lr)  # same shape, floor at the same fraction
    assert (critic.peak, critic.min_lr, critic.total_steps) == (config.critic_lr, pytest.approx(1e-4), 10)


def test_config_errors_name_the_flag():
    assert config_errors(RunConfig()) == []
    assert any("--min-lr" in e and "--lr" in e for e in config_errors(RunConfig(lr=1e-4, min_lr=1e-3, lr_decay_style="linear")))
    assert any("--min-lr" in e and "constant" in e for e in config_errors(RunConfig(min_lr=1e-5)))


# -- weight decay groups ---------------------------------------------------------------------------


def test_weight_decay_exempts_biases_and_norms_of_the_tiny_model():
    model = make_model()
    groups = optim.param_groups(model.named_parameters(), 0.1)
    name = {id(p): n for n, p in model.named_parameters()}
    decayed = {name[id(p)] for p in groups[0]["params"]}
    exempt = {name[id(p)] for p in groups[1]["params"]}
    assert groups[0]["weight_decay"] == 0.1 and groups[1]["weight_decay"] == 0.0
    assert decayed | exempt == set(name.values()) and not decayed & exempt
    assert decayed == {"tok_emb.weight", "pos_emb.weight"} | {
        f"blocks.{i}.{m}.weight" for i in range(2)
        for m in ("attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj", "mlp.fc_in", "mlp.fc_out")
    }
    assert all(n.endswith(".bias") or ".ln" in n or n.startswith("ln_f") for n in exempt)
    assert {"ln_f.weight", "ln_f.bias", "blocks.0.ln1.weight", "blocks.1.mlp.fc_out.bias"} <= exempt
    # wd 0: one group of every trainable parameter, as a plain AdamW(model.parameters()) has
    (only,) = optim.param_groups(model.named_parameters(), 0.0)
    assert [id(p) for p in only["params"]] == [id(p) for p in model.parameters()]


def test_weight_decay_exempts_norms_of_a_qwen3_model():
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM

    from relax.models.hf.tiny_random import model_config

    model = AutoModelForCausalLM.from_config(model_config("qwen3", 261, hidden=32, layers=1))
    groups = optim.param_groups(model.named_parameters(), 0.01)
    name = {id(p): n for n, p in model.named_parameters()}
    exempt = {name[id(p)] for p in groups[1]["params"]}
    assert exempt == {
        "model.norm.weight", "model.layers.0.input_layernorm.weight", "model.layers.0.post_attention_layernorm.weight",
        "model.layers.0.self_attn.q_norm.weight", "model.layers.0.self_attn.k_norm.weight",
    }
    decayed = {name[id(p)] for p in groups[0]["params"]}
    assert {"model.embed_tokens.weight", "lm_head.weight", "model.layers.0.mlp.gate_proj.weight"} <= decayed


def _zero_loss(lp, rows):
    return PolicyLossOutput(loss=(lp.log_probs * 0.0).sum(), metrics={})


def test_weight_decay_shrinks_decayed_weights_only_by_lr_times_wd():
    """A zero gradient leaves only the decoupled decay: decayed p -> p * (1 - lr * wd), exempt p unchanged."""
    model = make_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    backend = TorchBackend(model, lr=0.1, weight_decay=0.5, clip_grad=0.0)
    backend.train_step(make_batch(), _zero_loss)
    for name, p in model.named_parameters():
        expected = before[name] * (1 - 0.1 * 0.5) if optim.decays(name, p) else before[name]
        torch.testing.assert_close(p.detach(), expected, rtol=0, atol=1e-7, msg=name)


# -- TorchBackend with the run's flags -------------------------------------------------------------


def test_for_policy_reads_the_optimizer_flags_and_logs_the_scheduled_lr():
    config = RunConfig(num_rollout=3, num_steps_per_rollout=2, lr=1e-2, lr_warmup_steps=2, lr_decay_style="linear",
                       min_lr=1e-3, weight_decay=0.05, adam_beta1=0.8, adam_beta2=0.95, adam_eps=1e-6)
    backend = TorchBackend.for_policy(config, make_model())
    groups = backend.optimizer.param_groups
    assert [g["weight_decay"] for g in groups] == [0.05, 0.0]
    assert all(g["betas"] == (0.8, 0.95) and g["eps"] == 1e-6 for g in groups)
    batch = make_batch()
    loss_fn = weighted_loss(batch, advantages_for(batch), float(batch.response_mask.sum()))
    lrs = [backend.train_step(batch, loss_fn)["lr"] for _ in range(6)]
    # warm-up 5e-3, 1e-2; then linear over 4 steps from 1e-2 to 1e-3
    assert lrs == pytest.approx([5e-3, 1e-2, 1e-2, 7.75e-3, 5.5e-3, 3.25e-3])
    assert all(g["lr"] == pytest.approx(3.25e-3) for g in backend.optimizer.param_groups)


def test_default_flags_are_bit_identical_to_plain_adamw():
    config = RunConfig(lr=1e-2)
    batch = make_batch()
    loss_fn = weighted_loss(batch, advantages_for(batch), float(batch.response_mask.sum()))
    backend = TorchBackend.for_policy(config, make_model())
    for _ in range(3):
        metrics = backend.train_step(batch, loss_fn)
    assert metrics["lr"] == 1e-2 and metrics["optimizer_state_mib"] > 0
    reference = make_model()
    opt = torch.optim.AdamW(reference.parameters(), lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    for _ in range(3):
        opt.zero_grad()
        lp = TorchBackend(reference)._forward(batch, with_entropy=True)
        loss_fn(lp, slice(0, len(batch))).loss.backward()
        torch.nn.utils.clip_grad_norm_(list(reference.parameters()), 1.0)
        opt.step()
    for (k, a), b in zip(backend.model.state_dict().items(), reference.state_dict().values()):
        assert torch.equal(a, b), k


def test_optimizer_state_bytes_are_two_fp32_moments_per_parameter():
    model = make_model()
    backend = TorchBackend(model)
    batch = make_batch()
    metrics = backend.train_step(batch, weighted_loss(batch, advantages_for(batch), float(batch.response_mask.sum())))
    n = sum(p.numel() for p in model.parameters())
    steps = sum(1 for _ in model.parameters()) * 4  # one float32 step counter per parameter
    assert optim.optimizer_state_bytes(backend.optimizer) == 2 * 4 * n + steps
    assert metrics["optimizer_state_mib"] == pytest.approx((8 * n + steps) / 2**20)


def test_resume_across_a_weight_decay_change_keeps_the_moments_and_takes_the_new_flags():
    batch = make_batch()
    loss_fn = weighted_loss(batch, advantages_for(batch), float(batch.response_mask.sum()))
    a = TorchBackend(make_model(), lr=1e-2)  # one group
    a.train_step(batch, loss_fn)
    saved = a.state_dict()
    b = TorchBackend(make_model(seed=5), lr=1e-2, weight_decay=0.1)  # two groups
    b.load_state_dict(saved)
    assert [g["weight_decay"] for g in b.optimizer.param_groups] == [0.1, 0.0]
    moments_a = {n: a.optimizer.state[p]["exp_avg"] for n, p in a.model.named_parameters()}
    for n, p in b.model.named_parameters():
        assert torch.equal(b.optimizer.state[p]["exp_avg"], moments_a[n]), n
    # an old checkpoint (no name list: one group in parameter order) loads the same way
    old = {k: v for k, v in saved.items() if k != "optimizer_param_names"}
    c = TorchBackend(make_model(seed=5), lr=1e-2, weight_decay=0.1)
    c.load_state_dict(old)
    for n, p in c.model.named_parameters():
        assert torch.equal(c.optimizer.state[p]["exp_avg"], moments_a[n]), n


def test_flag_parsers_reject_bad_values():
    import argparse

    fields = attrs.fields(RunConfig)
    adam_beta1, lr_warmup_steps = (f.metadata["flag"].type for f in (fields.adam_beta1, fields.lr_warmup_steps))

    with pytest.raises(argparse.ArgumentTypeError, match=r"\[0, 1\)"):
        adam_beta1("1.0")
    with pytest.raises(argparse.ArgumentTypeError, match=">= 0"):
        lr_warmup_steps("-1")
    assert attrs.fields(RunConfig).lr_decay_style.metadata["flag"].choices == optim.DECAY_STYLES
