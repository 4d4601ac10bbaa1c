"""The torch backend's other passes with the model on a second device (``device_emulation.py``) and
its inputs from the CPU: the critic role's values and value loss, LoRA, activation recomputation with
bf16 autocast, and checkpoints (a state saved from the device holds CPU tensors, and a restore puts
them back on the model's device)."""

from __future__ import annotations

import pytest
import torch
from device_emulation import cpu_data, on_device, on_the_cpu
from device_steps import write_step

from relax.algorithms import AlgorithmConfig, PolicyLossOutput
from relax.backends.torch_backend import TorchBackend
from relax.config.run import RunConfig
from relax.models.factory import build_policy_model
from relax.runtime.data.memory_plane import MemoryDataPlane
from relax.runtime.step.advantages import AdvantagesCore
from relax.runtime.step.critic_worker import CriticCore
from relax.runtime.step.fields import BATCH_FIELDS, token_batch

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture(scope="module")
def hf_checkpoint(tmp_path_factory):
    from relax.models.hf.tiny_random import build_tiny_random_checkpoint

    return str(build_tiny_random_checkpoint(tmp_path_factory.mktemp("tiny") / "qwen2", "qwen2", hidden=32, layers=1))


def _config(**kw) -> RunConfig:
    return RunConfig(advantage_estimator=kw.pop("algo", "grpo"), algorithm=AlgorithmConfig(n_samples_per_prompt=4),
                     rollout_batch_size=4, num_steps_per_rollout=2, seed=3, lr=1e-4, adam_eps=1e-3, **kw)


def _cpu_batch(plane=None):
    plane = plane or MemoryDataPlane()
    plan = write_step(plane, 1)
    return token_batch(plane.read(1, BATCH_FIELDS, "check", plan.num_groups).fields), plan, plane


def _sum_loss(tlp, rows) -> PolicyLossOutput:
    return PolicyLossOutput(loss=tlp.log_probs.sum() / 100, metrics={})


def _tensors(tree):
    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, dict):
        for v in tree.values():
            yield from _tensors(v)
    elif isinstance(tree, (list, tuple)):
        for v in tree:
            yield from _tensors(v)


def _critic_step(config):
    plane = MemoryDataPlane()
    plan = write_step(plane, 1)
    critic = CriticCore(config, data_plane=plane)
    critic.values(1, plan)
    AdvantagesCore("ppo", config.algorithm, plane).compute(1, plan.num_groups, plan.segment_sizes, True, False, plan.uids)
    metrics = critic.train(1, plan)
    return critic, plane, plan, metrics


def test_critic_values_and_value_loss_on_the_device(device):
    config = _config(algo="ppo")
    critic, plane, plan, metrics = _critic_step(config)
    assert on_device(next(critic.model.parameters()))
    values = plane.read(1, ("values",), "check", plan.num_groups)["values"]
    assert not on_device(values) and values.device.type == "cpu", "values go back to the data plane on the CPU"
    with on_the_cpu():
        cpu_critic, cpu_plane, _, cpu_metrics = _critic_step(config)
        cpu_values = cpu_plane.read(1, ("values",), "check", plan.num_groups)["values"]
    torch.testing.assert_close(values, cpu_values)
    for key, value in cpu_metrics.items():
        if not key.startswith("time/"):
            assert metrics[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key


def test_checkpoint_of_a_device_backend_is_on_the_cpu_and_restores_onto_the_device(device):
    batch, *_ = _cpu_batch()
    backend = TorchBackend(build_policy_model(_config()), lr=1e-3)
    backend.train_step(batch, _sum_loss)
    state = backend.state_dict()
    assert all(not on_device(t) and t.device.type == "cpu" for t in _tensors(state))
    saved = {k: v.clone() for k, v in state["model"].items()}
    expected = backend.train_step(batch, _sum_loss)["grad_norm"]

    restored = TorchBackend(build_policy_model(_config()), lr=1e-3)
    restored.load_state_dict(state)
    moments = [t for s in restored.optimizer.state.values() for k, t in s.items() if k != "step"]
    assert moments and all(on_device(t) for t in moments), "Adam's moments follow their parameters"
    assert all(on_device(p) for p in restored.model.parameters())
    for name, p in restored.model.state_dict().items():
        assert torch.equal(cpu_data(p), saved[name]), name
    assert restored.train_step(batch, _sum_loss)["grad_norm"] == pytest.approx(expected, rel=1e-5)
    with on_the_cpu():  # and a CPU process (the driver, a CPU resume) loads it as it is
        cpu = TorchBackend(build_policy_model(_config(), device=torch.device("cpu")), lr=1e-3)
        cpu.load_state_dict(state)


def test_hf_export_of_a_device_backend_reads_cpu_tensors(device, hf_checkpoint, tmp_path):
    from relax.models.hf.checkpoint import export_hf_checkpoint

    backend = TorchBackend(build_policy_model(_config(hf_checkpoint=hf_checkpoint)))
    weights = TorchBackend.weights_in_state(backend.state_dict())
    with on_the_cpu():
        export_hf_checkpoint(weights, hf_checkpoint, tmp_path / "hf")
        from relax.models.hf import load_hf_model

        exported = load_hf_model(tmp_path / "hf").state_dict()
    for name, value in weights.items():
        assert torch.equal(exported[name], value), name


def test_lora_step_and_adapter_export_on_the_device(device, hf_checkpoint):
    pytest.importorskip("peft")
    batch, *_ = _cpu_batch()
    config = _config(hf_checkpoint=hf_checkpoint, lora_rank=2)
    backend = TorchBackend.for_policy(config, build_policy_model(config))
    before = backend.export_weights()
    metrics = backend.train_step(batch, _sum_loss)
    assert metrics["grad_norm"] > 0
    after = backend.export_weights()
    assert all(not on_device(t) for t in after.values())
    assert any(not torch.equal(after[k], before[k]) for k in after if k.endswith("lora_B.weight"))


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_recompute_and_bf16_step_on_the_device(device, hf_checkpoint, packed):
    batch, *_ = _cpu_batch()
    config = _config(hf_checkpoint=hf_checkpoint, recompute_activations=True, bf16=True,
                     max_tokens_per_micro_batch=24 if packed else None)
    backend = TorchBackend.for_policy(config, build_policy_model(config))
    log_probs = backend.compute_log_probs(batch, with_entropy=True)
    assert on_device(log_probs.log_probs) and on_device(log_probs.entropy)
    assert backend.train_step(batch, _sum_loss)["grad_norm"] > 0
    assert all(p.grad is None or on_device(p.grad) for p in backend.model.parameters())


def test_reference_pass_on_the_device(device, hf_checkpoint):
    from relax.models.factory import build_reference_model
    from relax.runtime.step.reference_pass import reference_log_probs

    batch, *_ = _cpu_batch()
    for budget in (None, 20):
        config = _config(hf_checkpoint=hf_checkpoint, max_tokens_per_micro_batch=budget, micro_batch_size=5)
        got = reference_log_probs(build_reference_model(config), batch, config)
        assert on_device(got)
        with on_the_cpu():
            expected = reference_log_probs(build_reference_model(config, device=torch.device("cpu")), batch, config)
        torch.testing.assert_close(cpu_data(got), expected, rtol=1e-5, atol=1e-5)


def test_an_hf_model_loaded_after_the_emulation_is_whole(device, hf_checkpoint):
    # transformers fills a model's rotary frequencies after building it on ``meta``; the emulation must
    # not leave a later (CPU) load with unfilled ones
    from relax.models.hf.loading import load_hf_model

    build_policy_model(_config(hf_checkpoint=hf_checkpoint))
    with on_the_cpu():
        first, second = load_hf_model(hf_checkpoint), load_hf_model(hf_checkpoint)
    inv_freq = first.model.rotary_emb.inv_freq
    assert inv_freq[0] == 1.0 and torch.isfinite(inv_freq).all()
    assert torch.equal(inv_freq, second.model.rotary_emb.inv_freq)
