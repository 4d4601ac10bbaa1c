"""The transformers engine's dtype: bfloat16 when the policy trains in bfloat16 (``--bf16``) on a GPU,
float32 on the CPU (with or without ``--bf16``); the weight route sends the engine's dtype."""

from __future__ import annotations

import pytest
import torch

from relax.config.run import RunConfig
from relax.rollout.hf.precision import engine_dtype

pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from relax.models.hf.tiny_random import build_tiny_random_checkpoint

    return str(build_tiny_random_checkpoint(tmp_path_factory.mktemp("hf_precision") / "qwen2", "qwen2",
                                            hidden=32, layers=1))


@pytest.mark.parametrize(("bf16", "device", "expected"), [
    (True, "cuda", torch.bfloat16),
    (True, torch.device("cuda", 1), torch.bfloat16),
    (True, "meta", torch.bfloat16),  # any accelerator, not only CUDA (the device-emulation tests use meta)
    (True, "cpu", torch.float32),  # the CPU stays float32, as the trainer's log-probs
    (False, "cuda", torch.float32),
    (False, "cpu", torch.float32),
])
def test_the_engine_dtype_is_bf16_only_for_bf16_training_on_an_accelerator(bf16, device, expected):
    assert engine_dtype(RunConfig(hf_checkpoint="/m", bf16=bf16), device) == expected


def test_on_the_cpu_the_engine_built_for_a_bf16_run_is_float32(checkpoint):
    from relax.rollout.factory import build_engine

    engine = build_engine(RunConfig(hf_checkpoint=checkpoint, bf16=True))
    assert engine.device.type == "cpu" and {p.dtype for p in engine.model.parameters()} == {torch.float32}


def test_the_engine_is_built_in_the_rule_s_dtype_on_a_gpu_and_the_weights_travel_in_it(checkpoint, monkeypatch):
    """The factory asks the rule with the worker's device; "cuda" is only handed to the loader here (a
    recorder), so the CPU-only machine checks what a GPU worker would build and be sent."""
    import relax.models.factory as model_factory
    from relax.models.hf import loading
    from relax.rollout.hf import factory
    from relax.runtime.weights.weight_sync import publish_dtype

    loads, load = [], loading.load_hf_model

    def record(path, *, dtype, device, **kwargs):
        loads.append((dtype, torch.device(device).type))
        return load(path, dtype=dtype, device="cpu", **kwargs)

    monkeypatch.setattr(loading, "load_hf_model", record)
    monkeypatch.setattr(factory, "HFEngine", lambda model, tokenizer, device: model)
    bf16, fp32 = RunConfig(hf_checkpoint=checkpoint, bf16=True), RunConfig(hf_checkpoint=checkpoint)
    model = factory.hf_engine_from_config(bf16, device="cuda")
    factory.hf_engine_from_config(fp32, device="cuda")
    factory.hf_engine_from_config(bf16, device="cpu")
    assert loads == [(torch.bfloat16, "cuda"), (torch.float32, "cuda"), (torch.float32, "cpu")]
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    # The actor rank that publishes stands on the engine's kind of device (relax places both alike).
    assert publish_dtype(bf16) is None  # this machine: the CPU, a float32 engine, float32 weights
    monkeypatch.setattr(model_factory, "default_device", lambda: torch.device("cuda"))
    assert publish_dtype(bf16) == torch.bfloat16 and publish_dtype(fp32) is None
