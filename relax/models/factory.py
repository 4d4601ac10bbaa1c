"""The trainer's models for a ``RunConfig``: policy, frozen reference and the forward adapter.

The embedded default (no ``--hf-checkpoint``) is the shipped warm-up ``TinyCausalLM``; with
``--hf-checkpoint`` a transformers ``*ForCausalLM`` loaded from that directory. Both are placed on
``device`` (default: ``default_device()``, the worker's GPU when it has one). Every process calls
these with the same config, so the rollout's copy and every training rank start from the same
weights without sending them around.
"""

from __future__ import annotations

import torch
from torch import nn

from relax.config.run import RunConfig
from relax.models.batch import ForwardLogits, default_forward_logits


def default_device() -> torch.device:
    """A training worker's device: its GPU when it has one (Ray gives a worker without a GPU an empty
    ``CUDA_VISIBLE_DEVICES``), else the CPU. The built-in model follows it too: loading it on the CPU
    and moving it is bit for bit the CPU's weights."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def build_policy_model(config: RunConfig, *, device=None, dtype=torch.float32) -> nn.Module:
    """The trainable policy, initialized exactly like the rollout engine's copy."""
    if config.hf_checkpoint:
        from relax.models.hf.loading import load_hf_model

        return load_hf_model(config.hf_checkpoint, dtype=dtype, device=device or default_device())
    from relax.models.tiny.weights import load_warmup_model

    return load_warmup_model(_task_checkpoint(config)).to(device or default_device())


def build_reference_model(config: RunConfig, *, device=None, dtype=torch.float32) -> nn.Module:
    """The frozen reference policy: ``--ref-load`` if given, else the initial policy."""
    if config.hf_checkpoint:
        from relax.models.hf.loading import load_hf_model

        path, flag = (config.ref_load, "--ref-load") if config.ref_load else (config.hf_checkpoint, "--hf-checkpoint")
        model = load_hf_model(path, dtype=dtype, device=device or default_device(), flag=flag)
    else:
        from relax.models.tiny.weights import load_warmup_model

        model = load_warmup_model(config.ref_load or _task_checkpoint(config)).to(device or default_device())
    model.requires_grad_(False)
    return model.eval()


def _task_checkpoint(config: RunConfig):
    """The built-in model's starting weights: those of a ``relax sft`` checkpoint that ``--load``
    names (``relax.models.initial_weights``), else the ``--task``'s own tiny checkpoint
    (``calculator``), else None: the shipped warm-up."""
    from relax.models.initial_weights import sft_tiny_model
    from relax.models.tiny.calculator import TASK_CHECKPOINTS

    return sft_tiny_model(getattr(config, "load", None)) or TASK_CHECKPOINTS.get(getattr(config, "task", None))


def forward_logits_fn(config: RunConfig) -> ForwardLogits:
    if config.hf_checkpoint:
        from relax.models.hf.adapter import hf_forward_logits

        return hf_forward_logits
    return default_forward_logits
