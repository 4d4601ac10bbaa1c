"""What a ``RunConfig`` asks of the torch backend before it is built: the ``--lora-*`` checks,
``--recompute-activations`` on a model, and the constructor's optimizer and precision options."""

from __future__ import annotations

import importlib.util

from torch import nn

from relax.backends import optim
from relax.config.run import RunConfig

_LORA_DEFAULTS = {"lora_alpha": ("--lora-alpha", 16.0), "lora_dropout": ("--lora-dropout", 0.0),
                  "lora_target_modules": ("--lora-target-modules", ("all-linear",))}


def lora_config_errors(config: RunConfig) -> list[str]:
    """``--lora-*`` checks: the adapter flags need ``--lora-rank``, which needs ``--hf-checkpoint`` and peft."""
    if not config.lora_rank:
        return [f"{name} has no effect without --lora-rank" for field, (name, default) in _LORA_DEFAULTS.items()
                if getattr(config, field) != default]
    errors = []
    if not config.hf_checkpoint:
        errors.append("--lora-rank adapts a Hugging Face model: give --hf-checkpoint (the built-in model trains whole)")
    if importlib.util.find_spec("peft") is None:
        errors.append("--lora-rank needs the 'peft' package, which is not installed: pip install 'relax-rl[lora]'")
    return errors


def enable_recompute(model: nn.Module) -> None:
    """``--recompute-activations``: checkpoint every transformer block of ``model`` (the built-in
    ``TinyCausalLM``, a transformers ``*ForCausalLM``, or a ``ValueModel`` on either)."""
    target = getattr(model, "trunk", model)  # a ValueModel recomputes its trunk
    if hasattr(target, "activation_checkpointing_enable"):  # transformers >= 5.x's name
        target.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    elif hasattr(target, "gradient_checkpointing_enable"):  # TinyCausalLM, older transformers
        target.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        raise TypeError(f"--recompute-activations: {type(target).__name__} has no gradient_checkpointing_enable()")


def backend_options(config: RunConfig, schedule: optim.LRSchedule) -> dict:
    """The constructor's optimizer / precision options from a ``RunConfig``."""
    return dict(lr=schedule.peak, schedule=schedule, weight_decay=config.weight_decay, bf16=config.bf16,
                **optim.adam_kwargs(config))
