"""What the runtime calls when ``--hf-checkpoint`` is set.

- rollout worker: ``engine = hf_engine_from_config(config)`` (its ``.tokenizer`` encodes prompts);
- prompts: ``relax.rollout.data.prompt_iterator_from_config(config, engine.tokenizer)``;
- actor / reference worker: ``model = hf_policy_model(config)`` / ``hf_reference_model(config)``,
  then ``TorchBackend(model, forward_logits=hf_forward_logits, temperature=config.rollout_temperature,
  lr=config.lr, clip_grad=config.clip_grad, ...)``;
- checkpoints: ``save_hf_checkpoint(backend.model, DIR, tokenizer_source=config.hf_checkpoint)``.

The model dtype defaults to float32 (rollout and trainer log-probs must agree); ``dtype="bfloat16"``
halves memory on GPU at the price of a log-prob mismatch of order 1e-2.
"""

from __future__ import annotations

import torch

from relax.rollout.hf.engine import HFEngine
from relax.rollout.hf.loading import load_hf_model, load_hf_tokenizer


def default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def hf_engine_from_config(config, *, device=None, dtype=torch.float32) -> HFEngine:
    """The rollout engine for ``config.hf_checkpoint``."""
    if not config.hf_checkpoint:
        raise ValueError("hf_engine_from_config needs --hf-checkpoint")
    device = device or default_device()
    model = load_hf_model(config.hf_checkpoint, dtype=dtype, device=device)
    return HFEngine(model, load_hf_tokenizer(config.hf_checkpoint), device=device)


def hf_policy_model(config, *, device=None, dtype=torch.float32) -> torch.nn.Module:
    """The trainable policy: ``config.hf_checkpoint`` (put in train mode by the backend)."""
    if not config.hf_checkpoint:
        raise ValueError("hf_policy_model needs --hf-checkpoint")
    return load_hf_model(config.hf_checkpoint, dtype=dtype, device=device or default_device())


def hf_reference_model(config, *, device=None, dtype=torch.float32) -> torch.nn.Module:
    """The frozen reference: ``--ref-load`` if given, else ``--hf-checkpoint``."""
    path, flag = (
        (config.ref_load, "--ref-load") if config.ref_load else (config.hf_checkpoint, "--hf-checkpoint")
    )
    if not path:
        raise ValueError("a reference model needs --ref-load or --hf-checkpoint")
    model = load_hf_model(path, dtype=dtype, device=device or default_device(), flag=flag)
    model.requires_grad_(False)
    return model
