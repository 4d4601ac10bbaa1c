"""The transformers engine of a ``--bf16`` run on a second device (emulated on the CPU): built on the
worker's device in bfloat16, it generates there and returns CPU tensors, and the weights an actor rank
on that device publishes travel in bfloat16 and land in the engine as the trainer's float32 weights'
rounding. The same run on the CPU keeps a float32 engine (``tests/rollout/test_hf_engine_precision.py``)."""

from __future__ import annotations

import pytest
import torch
from device_emulation import cpu_data, on_device, on_the_cpu

from relax.algorithms import AlgorithmConfig
from relax.config.run import RunConfig
from relax.rollout.base import SamplingParams

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture(scope="module")
def hf_checkpoint(tmp_path_factory):
    from relax.models.hf.tiny_random import build_tiny_random_checkpoint

    return str(build_tiny_random_checkpoint(tmp_path_factory.mktemp("tiny") / "qwen2", "qwen2", hidden=32, layers=1))


def _config(hf: str, **kw) -> RunConfig:
    return RunConfig(advantage_estimator="grpo", hf_checkpoint=hf, algorithm=AlgorithmConfig(), bf16=True, **kw)


def _generate(engine, prompts):
    return engine.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=5), torch.Generator().manual_seed(0))


@pytest.mark.parametrize("decoding", ["dynamic", "static"])
def test_a_bf16_run_s_engine_is_bf16_on_the_device_and_generates_there(device, hf_checkpoint, decoding):
    from relax.rollout.factory import build_engine

    engine = build_engine(_config(hf_checkpoint))
    params = list(engine.model.parameters())
    assert all(on_device(p) for p in params) and {p.dtype for p in params} == {torch.bfloat16}
    prompts = [engine.tokenizer.encode(text) for text in ("1 + 2 =", "a longer prompt here")]
    # static: the decoding a CUDA worker gets, without the graph capture (a CUDA-only step)
    engine._decoding = engine._make_decoding(decoding)
    gen = _generate(engine, prompts)
    assert not on_device(gen.log_probs) and gen.log_probs.device.type == "cpu"
    assert not on_device(gen.batch.response_ids)
    with on_the_cpu():  # the same bfloat16 weights on the CPU choose the same tokens
        from relax.models.hf.loading import load_hf_model
        from relax.rollout.hf import HFEngine

        reference = HFEngine(load_hf_model(hf_checkpoint, dtype=torch.bfloat16), engine.tokenizer)
        expected = _generate(reference, prompts)
    assert torch.equal(gen.batch.response_ids, expected.batch.response_ids)
    torch.testing.assert_close(gen.log_probs, expected.log_probs, atol=2e-2, rtol=0)


def test_an_actor_on_the_device_publishes_bf16_weights_that_the_engine_takes_as_their_rounding(device, hf_checkpoint):
    from relax.rollout.factory import build_engine
    from relax.runtime.step.actor_worker import ActorCore
    from relax.runtime.weights.weight_sync import ObjectStoreSync

    config = _config(hf_checkpoint)
    # the transport a driver without a GPU builds (float32): the actor on the device decides the dtype itself
    actor = ActorCore(config, "grpo", with_reference=False, advantages_on_actor=True, weight_sync=ObjectStoreSync(None))
    exported = actor.weight_sync.export(actor.backend, 0)
    handle = actor.weight_sync.publish(exported)
    received = handle.unpack()
    assert {t.dtype for t in received.values()} == {torch.bfloat16}  # half the bytes of the float32 export
    engine = build_engine(config)
    engine.load_weights(received)
    for name, value in engine.model.state_dict().items():
        assert on_device(value) and value.dtype == torch.bfloat16, name
        assert torch.equal(cpu_data(value), cpu_data(exported[name]).to(torch.bfloat16)), name
