"""Megatron paths that CPU cannot exercise: they skip with the reason on CPU-only machines."""

from __future__ import annotations

import importlib.util

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
