"""The rollout engine for ``--hf-checkpoint`` (the trainer's copy: ``relax.models.factory``).

The engine runs on the rollout worker's device (its GPU when Ray gave it one) in the dtype of
``relax.rollout.hf.precision``: bfloat16 with ``--bf16`` on a GPU, float32 otherwise.
"""

from __future__ import annotations

import torch

from relax.models import factory as model_factory
from relax.models.hf import loading
from relax.rollout.hf.engine import HFEngine
from relax.rollout.hf.precision import engine_dtype


def hf_engine_from_config(config, *, device=None, dtype: torch.dtype | None = None) -> HFEngine:
    """The rollout engine for ``config.hf_checkpoint``; its ``.tokenizer`` encodes the prompts.
    ``dtype`` (default: ``engine_dtype(config, device)``) overrides the run's precision rule."""
    if not config.hf_checkpoint:
        raise ValueError("hf_engine_from_config needs --hf-checkpoint")
    # looked up on the modules at call time: the device-emulation tests replace both
    device = device or model_factory.default_device()
    dtype = engine_dtype(config, device) if dtype is None else dtype
    model = loading.load_hf_model(config.hf_checkpoint, dtype=dtype, device=device)
    return HFEngine(model, loading.load_hf_tokenizer(config.hf_checkpoint), device=device)
