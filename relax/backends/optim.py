"""Optimizer settings shared by every training backend: Adam hyper-parameters, which parameters get
weight decay, and the learning-rate schedule.

Both backends read the same ``RunConfig`` fields through this module, so that a run behaves alike on
``--backend torch`` and ``--backend megatron``:

- **weight decay** (``--weight-decay``, decoupled as in AdamW) applies to every trainable parameter
  except biases and other one-dimensional parameters (LayerNorm / RMSNorm scales, Qwen3's q/k norms).
  That is Megatron's classic rule (``len(param.shape) == 1 or name.endswith(".bias")``), applied by
  name and shape, so it holds for the built-in model and for any Hugging Face model alike;
- **Adam** ``--adam-beta1``, ``--adam-beta2``, ``--adam-eps``;
- **learning rate** (``LRSchedule``): a linear warm-up over ``--lr-warmup-steps`` optimizer steps,
  then ``--lr-decay-style`` constant / linear / cosine from the peak (``--lr``) down to ``--min-lr``
  over the run's remaining optimizer steps (``--num-rollout`` x optimizer steps per rollout).

The defaults (constant ``--lr``, weight decay 0, betas 0.9 / 0.999, eps 1e-8) leave the optimizer
exactly as it was before these flags existed: one parameter group, the learning rate never touched.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import attrs
import torch

from relax.config.run import RunConfig
from relax.config.run_flags import LR_DECAY_STYLES as DECAY_STYLES
from relax.config.steps import total_optimizer_steps

# -- weight decay ----------------------------------------------------------------------------------


def decays(name: str, param: torch.Tensor) -> bool:
    """Does weight decay apply to this parameter? Not to biases nor to 1-D parameters (norm scales)."""
    return param.ndim > 1 and not name.endswith(".bias")


def param_groups(named_parameters: Iterable[tuple[str, torch.Tensor]], weight_decay: float) -> list[dict]:
    """AdamW parameter groups of the trainable parameters: ``[{params, weight_decay}, {params, 0.0}]``
    (decayed first, exempt second; an empty group is left out). With ``weight_decay == 0`` a single
    group of every trainable parameter, as a plain ``AdamW(model.parameters())`` would have."""
    trainable = [(n, p) for n, p in named_parameters if p.requires_grad]
    if weight_decay == 0:
        return [{"params": [p for _, p in trainable], "weight_decay": 0.0}]
    decayed = [p for n, p in trainable if decays(n, p)]
    exempt = [p for n, p in trainable if not decays(n, p)]
    groups = [{"params": decayed, "weight_decay": weight_decay}, {"params": exempt, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def adam_kwargs(config: RunConfig) -> dict:
    """``betas`` and ``eps`` of ``torch.optim.AdamW`` from a ``RunConfig``."""
    return {"betas": (config.adam_beta1, config.adam_beta2), "eps": config.adam_eps}


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes held by the optimizer's state tensors (Adam: two moments per parameter, and the steps)."""
    from torch.distributed.tensor import DTensor

    # a sharded state tensor (--sharding fsdp) counts this rank's shard
    return sum(
        (v.to_local() if isinstance(v, DTensor) else v).numel() * v.element_size()
        for state in optimizer.state.values()
        for v in state.values()
        if isinstance(v, torch.Tensor)
    )


def param_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The names of ``optimizer``'s parameters in its own order (the integer ids of its state_dict)."""
    name_of = {id(p): n for n, p in model.named_parameters()}
    return [name_of[id(p)] for group in optimizer.param_groups for p in group["params"]]


def regrouped_state(saved: dict, saved_names: list[str], optimizer: torch.optim.Optimizer,
                    names: list[str]) -> dict:
    """An optimizer ``state_dict`` for ``optimizer`` (whose parameters are ``names``, in order) holding
    the per-parameter state of ``saved`` (whose parameters were ``saved_names``) and ``optimizer``'s
    own group settings: a run resumed with another ``--weight-decay`` (another grouping) or other
    Adam flags keeps its moments and uses the flags it was started with."""
    index = {name: i for i, name in enumerate(saved_names)}
    missing = [n for n in names if n not in index]
    if missing or len(saved_names) != len(names):
        extra = sorted(set(saved_names) - set(names))
        raise KeyError(
            f"the checkpoint's optimizer state does not match this model's trainable parameters "
            f"(missing {missing[:5]}, unexpected {extra[:5]}); was it saved with another model or --lora-* setting?"
        )
    state = {new: saved["state"][index[n]] for new, n in enumerate(names) if index[n] in saved["state"]}
    return {"state": state, "param_groups": optimizer.state_dict()["param_groups"]}


# -- learning-rate schedule ------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class LRSchedule:
    """The learning rate of each optimizer step.

    ``lr(step)`` is the rate used by optimizer step number ``step + 1`` (``step`` = steps already
    taken, counted from 0 at the start of the run and restored from checkpoints):

    - warm-up, ``step < warmup_steps``: ``peak * (step + 1) / warmup_steps`` (the first step is not
      wasted at rate 0, the last warm-up step runs at the peak);
    - afterwards, with ``progress = (step - warmup_steps) / (total_steps - warmup_steps)`` (clamped
      to [0, 1]): ``constant``: ``peak``; ``linear``: ``min_lr + (peak - min_lr) * (1 - progress)``;
      ``cosine``: ``min_lr + (peak - min_lr) * (1 + cos(pi * progress)) / 2``.

    The first step after warm-up runs at the peak and the run's last step just above ``min_lr``; a
    run that continues past ``total_steps`` stays at ``min_lr``.
    """

    peak: float
    min_lr: float = 0.0
    warmup_steps: int = 0
    decay_style: str = "constant"
    total_steps: int = 1

    def __attrs_post_init__(self):
        if self.decay_style not in DECAY_STYLES:
            raise ValueError(f"--lr-decay-style must be one of {', '.join(DECAY_STYLES)}, got {self.decay_style!r}")
        if self.min_lr > self.peak:
            raise ValueError(f"--min-lr {self.min_lr} must not exceed the peak learning rate {self.peak}")
        if self.warmup_steps < 0:
            raise ValueError(f"--lr-warmup-steps must be >= 0, got {self.warmup_steps}")

    @property
    def is_constant(self) -> bool:
        """True when every step runs at ``peak`` (the optimizer's own rate is never touched)."""
        return self.warmup_steps == 0 and self.decay_style == "constant"

    def lr(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.peak * (step + 1) / self.warmup_steps
        if self.decay_style == "constant":
            return self.peak
        span = self.total_steps - self.warmup_steps
        progress = min(1.0, max(0.0, (step - self.warmup_steps) / span)) if span > 0 else 1.0
        if self.decay_style == "linear":
            factor = 1.0 - progress
        else:
            factor = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.min_lr + (self.peak - self.min_lr) * factor


def lr_schedule(config: RunConfig, *, peak: float | None = None) -> LRSchedule:
    """The schedule of a run. ``peak`` defaults to ``--lr``; another peak (the critic's
    ``--critic-lr``) keeps the same warm-up and decay, with its floor at the same fraction
    ``--min-lr / --lr`` of its peak."""
    min_lr = config.min_lr if peak is None else peak * config.min_lr / config.lr
    return LRSchedule(
        peak=config.lr if peak is None else peak,
        min_lr=min_lr,
        warmup_steps=config.lr_warmup_steps,
        decay_style=config.lr_decay_style,
        total_steps=total_optimizer_steps(config),
    )


def set_learning_rate(optimizer, lr: float) -> None:
    """Set every parameter group's rate (``lr_mult``, Megatron's per-group multiplier, is honoured)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_mult", 1.0)


# -- configuration checks --------------------------------------------------------------------------


def config_errors(config: RunConfig) -> list[str]:
    """Checks of the optimization flags that hold for every backend (messages name the flag)."""
    errors = []
    if config.min_lr > config.lr:
        errors.append(f"--min-lr {config.min_lr} must not exceed --lr {config.lr} (the peak learning rate)")
    if config.min_lr and config.lr_decay_style == "constant":
        errors.append(
            f"--min-lr {config.min_lr} has no effect with --lr-decay-style constant: add --lr-decay-style "
            "linear or cosine, or drop --min-lr"
        )
    return errors
