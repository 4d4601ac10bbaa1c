"""The engines on their rollout worker's device: the model where the worker's GPU is (the CPU
without one), the tensors they return on the CPU, new weights cast to the engine's own dtype."""

from __future__ import annotations

import pytest
import torch

from relax.config.run import RunConfig
from relax.rollout import factory
from relax.rollout.base import SamplingParams
from relax.rollout.tasks import get_task

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def prompts(engine, n=6):
    return [engine.tokenizer.encode(p.text) for p in get_task("addition").make_prompts(0).next_batch(n)]


def test_the_tiny_engine_runs_on_the_default_device():
    engine = factory.build_engine(RunConfig())
    assert engine.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    gen = engine.generate(prompts(engine), SamplingParams(max_new_tokens=6), torch.Generator().manual_seed(0))
    assert gen.log_probs.device.type == "cpu" and gen.batch.response_ids.device.type == "cpu"


@CUDA
def test_the_tiny_engine_on_cuda_samples_what_it_samples_on_the_cpu():
    """The worker's CPU generator drives both, so one seed gives the same tokens up to float rounding."""
    cpu, gpu = get_task("addition").make_engine(), get_task("addition").make_engine().to("cuda")
    ids = prompts(cpu, 16)
    for params in (SamplingParams(temperature=0.0, max_new_tokens=8), SamplingParams(max_new_tokens=8)):
        a = cpu.generate(ids, params, torch.Generator().manual_seed(3))
        b = gpu.generate(ids, params, torch.Generator().manual_seed(3))
        assert b.log_probs.device.type == "cpu"
        assert torch.equal(a.batch.response_ids, b.batch.response_ids)
        torch.testing.assert_close(a.log_probs, b.log_probs, atol=1e-4, rtol=0)
    gpu.load_weights(cpu.model.state_dict())  # CPU tensors from the trainer
    assert next(gpu.model.parameters()).device.type == "cuda"


def test_hf_engine_casts_new_weights_to_its_dtype():
    pytest.importorskip("transformers")
    from relax.models.hf.tiny_random import build_tiny_random_checkpoint
    from relax.models.hf import load_hf_model, load_hf_tokenizer
    from relax.rollout.hf import HFEngine

    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        path = build_tiny_random_checkpoint(Path(tmp) / "m", "qwen2", hidden=32, layers=1)
        engine = HFEngine(load_hf_model(path, dtype=torch.bfloat16), load_hf_tokenizer(path))
        trainer = load_hf_model(path)  # float32, as the trainer's copy
    weights = {k: v + 0.01 for k, v in trainer.state_dict().items()}
    engine.load_weights(weights)
    for name, value in engine.model.state_dict().items():
        assert value.dtype == torch.bfloat16 and value.device == engine.device
        assert torch.equal(value, weights[name].to(torch.bfloat16))
