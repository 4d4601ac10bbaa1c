"""The weights travel to the rollout engines in the dtype the engines hold the policy in: a bfloat16
engine (vLLM with ``--bf16``) is sent bfloat16, half the bytes of the trainer's float32 weights."""

from __future__ import annotations

import pytest
import torch

from relax.algorithms import AlgorithmConfig
from relax.config.run import RunConfig
from relax.runtime.weights.weight_sync import ObjectStoreSync, publish_dtype


def _weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"w": torch.randn((64, 32), generator=g), "b": torch.randn(32, generator=g),
            "steps": torch.arange(5)}  # an integer tensor travels as it is


def test_published_weights_travel_in_the_engine_dtype_at_half_the_bytes():
    weights = _weights()
    full, half = ObjectStoreSync().publish(weights), ObjectStoreSync(torch.bfloat16).publish(weights)
    received = half.unpack()
    assert received["w"].dtype == received["b"].dtype == torch.bfloat16 and received["steps"].dtype == torch.int64
    for name, value in weights.items():
        assert torch.equal(received[name], value.to(torch.bfloat16) if value.is_floating_point() else value), name
    assert half.buffer.nbytes < 0.6 * full.buffer.nbytes
    assert all(torch.equal(full.unpack()[k], v) for k, v in weights.items())  # float32: bit for bit


def test_a_lora_adapter_payload_travels_as_exported():
    from relax.models.hf.lora import ADAPTER_CONFIG_KEY

    payload = {"x.lora_A.weight": torch.randn(2, 8), ADAPTER_CONFIG_KEY: torch.zeros(3, dtype=torch.uint8)}
    received = ObjectStoreSync(torch.bfloat16).publish(payload).unpack()
    assert torch.equal(received["x.lora_A.weight"], payload["x.lora_A.weight"])


def _config(**kw) -> RunConfig:
    return RunConfig(advantage_estimator="grpo", algorithm=AlgorithmConfig(), **kw)


def test_publish_dtype_is_the_vllm_engines_and_none_for_float32_engines(tmp_path, monkeypatch):
    from relax.rollout.vllm import factory

    assert publish_dtype(_config()) is None  # the built-in engine: the trainer's own dtype
    # transformers on this process's device, the CPU: float32 (bfloat16 on a GPU: test_hf_engine_on_device.py)
    assert publish_dtype(_config(hf_checkpoint=str(tmp_path), bf16=True)) is None
    vllm = _config(hf_checkpoint=str(tmp_path), rollout_engine="vllm", bf16=True)
    # the engine's rule (relax.rollout.vllm.factory.engine_dtype) decides; here one that says bfloat16
    monkeypatch.setattr(factory, "engine_dtype", lambda config: "bfloat16" if config.bf16 else "float32",
                        raising=False)
    assert publish_dtype(vllm) == torch.bfloat16
    monkeypatch.setattr(factory, "engine_dtype", lambda config: "float32", raising=False)
    assert publish_dtype(vllm) is None


@pytest.mark.filterwarnings("ignore")
def test_the_actor_publishes_in_the_engine_dtype(tmp_path, monkeypatch):
    from relax.models.hf.tiny_random import build_tiny_random_checkpoint
    from relax.rollout.vllm import factory
    from relax.runtime.step.actor_worker import ActorCore

    monkeypatch.setattr(factory, "engine_dtype", lambda config: "bfloat16" if config.bf16 else "float32",
                        raising=False)
    ckpt = build_tiny_random_checkpoint(tmp_path / "ck", "qwen2", hidden=32, layers=1)
    config = _config(hf_checkpoint=str(ckpt), rollout_engine="vllm", bf16=True)
    actor = ActorCore(config, "grpo", with_reference=False, advantages_on_actor=True)
    handle = actor.weight_sync.publish(actor.weight_sync.export(actor.backend, 0))
    assert {t.dtype for t in handle.unpack().values()} == {torch.bfloat16}
