"""The rollout engine for ``--hf-checkpoint`` (the trainer's copy: ``relax.models.factory``).

The model dtype defaults to float32 (rollout and trainer log-probs must agree); ``dtype="bfloat16"``
halves memory on GPU at the price of a log-prob mismatch of order 1e-2.
"""

from __future__ import annotations

import torch

from relax.models.factory import default_device
from relax.models.hf.loading import load_hf_model, load_hf_tokenizer
from relax.rollout.hf.engine import HFEngine


def hf_engine_from_config(config, *, device=None, dtype=torch.float32) -> HFEngine:
    """The rollout engine for ``config.hf_checkpoint``; its ``.tokenizer`` encodes the prompts."""
    if not config.hf_checkpoint:
        raise ValueError("hf_engine_from_config needs --hf-checkpoint")
    device = device or default_device()
    model = load_hf_model(config.hf_checkpoint, dtype=dtype, device=device)
    return HFEngine(model, load_hf_tokenizer(config.hf_checkpoint), device=device)
