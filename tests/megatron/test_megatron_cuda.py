"""Megatron paths that CPU cannot exercise: they skip with the reason on CPU-only machines.

On a GPU machine (``pytest -m megatron tests/megatron/test_megatron_cuda.py``) they train the
Megatron backend on CUDA in float32 and bf16 and compare it with the torch backend's float32 run."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch

pytestmark = [
    pytest.mark.megatron,
    pytest.mark.skipif(importlib.util.find_spec("megatron.core") is None, reason="megatron-core is not installed"),
]

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (no GPU on this machine)")
requires_te = pytest.mark.skipif(
    importlib.util.find_spec("transformer_engine") is None, reason="needs Transformer Engine (not installed)"
)


@requires_cuda
@requires_te
@pytest.mark.timeout(120)
def test_transformer_engine_layer_spec_and_config_build():
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec

    from relax.backends.megatron.model import transformer_config
    from relax.models.tiny.model import TinyLMConfig

    spec = get_gpt_layer_with_transformer_engine_spec()
    config = transformer_config(TinyLMConfig())
    assert spec is not None and config.num_layers == 2


@requires_cuda
@pytest.mark.timeout(120)
def test_cpu_compat_refuses_to_run_on_cuda_machines():
    from relax.backends.megatron import _cpu_compat

    with pytest.raises(RuntimeError, match="CUDA is available"):
        _cpu_compat.apply()


@pytest.fixture(scope="module")
def on_the_gpu():
    from megatron_harness import run_distributed
    import megatron_cuda_workers as C

    return run_distributed(C.trains_on_the_gpu, 1, pg_backend="nccl")[0]


@requires_cuda
@pytest.mark.timeout(300)
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_megatron_trains_on_the_gpu(on_the_gpu, precision):
    import megatron_workers as W

    run, reference = on_the_gpu[precision], on_the_gpu["torch"]
    assert run["device"] == "cuda:0" and run["current_device"] == 0
    assert not run["compat_applied"]  # the CPU patches never go in on a CUDA machine
    assert run["param_devices"] == {"cuda"} and run["master_devices"] == {"cuda"}
    assert run["param_dtypes"] == ({torch.bfloat16} if precision == "bf16" else {torch.float32})
    assert run["log_probs_device"] == "cuda"  # where the model is, like the torch backend's
    # what leaves the rank (weights published to the rollout, checkpoints, the HF export) is on the CPU
    assert run["exported_devices"] == {"cpu"} and run["state_devices"] == {"cpu"}
    tol = 0.03 if precision == "bf16" else 1e-4  # bf16 rounding; float32 GPU kernels' reduction order
    batch = W.make_batch()
    valid = batch.response_mask
    assert float((run["log_probs"] - reference["log_probs"])[valid].abs().max()) < tol
    for step, reference_step in zip(run["metrics"], reference["metrics"], strict=True):
        assert math.isfinite(step["grad_norm"])
        assert step["loss"] == pytest.approx(reference_step["loss"], abs=tol)
    # resuming the checkpoint replays the same step
    assert run["resumed_step"]["loss"] == pytest.approx(run["next_step"]["loss"], abs=1e-5)
    for name, weight in run["after_next"].items():
        assert torch.allclose(run["after_resumed"][name], weight, atol=1e-5), name  # GPU backward: atomics
