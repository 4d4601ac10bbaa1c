"""LoRA adapters on transformers models (``peft``, the ``lora`` extra): wrapping a model for training,
the adapter *payload* that travels to the rollout and into checkpoints, merging it into a plain model,
and writing it in PEFT's format.

The payload is a flat ``{name: tensor}`` in the base model's own parameter names
(``model.layers.0.self_attn.q_proj.lora_A.weight`` ``[r, in]``, ``... .lora_B.weight`` ``[out, r]``)
plus ``ADAPTER_CONFIG_KEY``, the adapter's settings as JSON bytes in a uint8 tensor, so it packs like
any weights. Whoever holds the base model merges it: ``W = W_base + (B @ A) * scaling`` with
``scaling = lora_alpha / r`` — the same expression, in the same order, as ``peft``'s own merge. The
base weights of the adapted layers are kept (``_relax_lora_base`` on the model) the first time, so
every later payload is merged into the *base*, never on top of the previous merge.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

ADAPTER_CONFIG_KEY = "__lora_config__"
ALL_LINEAR = "all-linear"
_PEFT_PREFIX = "base_model.model."
_BASE_ATTR = "_relax_lora_base"


def require_peft():
    try:
        import peft
    except ImportError as exc:
        raise ImportError(
            "--lora-rank needs the 'peft' package: pip install 'relax-rl[lora]' (keep torch==2.13.0 pinned)"
        ) from exc
    return peft


def wrap_with_lora(model: torch.nn.Module, *, rank: int, alpha: float, dropout: float,
                   target_modules: Sequence[str]) -> torch.nn.Module:
    """``peft.get_peft_model``: every base parameter frozen, LoRA A/B trainable on ``target_modules``
    (module-name suffixes such as ``q_proj``, or ``all-linear``: every linear layer but the output head)."""
    peft = require_peft()
    targets = ALL_LINEAR if tuple(target_modules) == (ALL_LINEAR,) else list(target_modules)
    config = peft.LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets, bias="none")
    try:
        with warnings.catch_warnings():
            # peft reads transformers' deprecated `is_gradient_checkpointing`: news for peft, not for a user
            warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated",
                                    category=FutureWarning)
            return peft.get_peft_model(model, config)
    except ValueError as exc:
        raise ValueError(f"--lora-target-modules {' '.join(target_modules)}: {exc}") from exc


def _hf_name(peft_name: str) -> str:
    return peft_name.removeprefix(_PEFT_PREFIX).replace(".default.", ".")


def adapter_payload(peft_model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The trained adapter as a payload (CPU copies, base-model names) with its settings."""
    config = peft_model.peft_config["default"]
    out = {_hf_name(n): p.detach().to("cpu", copy=True) for n, p in peft_model.named_parameters() if ".lora_" in n}
    if not out:
        raise ValueError("the model carries no LoRA parameters")
    modules = sorted({k.rsplit(".lora_", 1)[0].rsplit(".", 1)[-1] for k in out})
    settings = {"r": config.r, "lora_alpha": config.lora_alpha, "lora_dropout": config.lora_dropout,
                "target_modules": modules, "scaling": config.lora_alpha / config.r}
    out[ADAPTER_CONFIG_KEY] = torch.tensor(list(json.dumps(settings).encode()), dtype=torch.uint8)
    return out


def is_adapter_payload(weights: Mapping[str, torch.Tensor]) -> bool:
    return ADAPTER_CONFIG_KEY in weights


def adapter_settings(payload: Mapping[str, torch.Tensor]) -> dict:
    return json.loads(bytes(payload[ADAPTER_CONFIG_KEY].tolist()).decode())


def _layers(payload: Mapping[str, torch.Tensor]) -> list[str]:
    return sorted(k.removesuffix(".lora_A.weight") for k in payload if k.endswith(".lora_A.weight"))


def load_adapter(peft_model: torch.nn.Module, payload: Mapping[str, torch.Tensor]) -> None:
    """Copy a payload's A/B matrices into a ``wrap_with_lora`` model (checkpoint resume)."""
    params = {_hf_name(n): p for n, p in peft_model.named_parameters() if ".lora_" in n}
    given = {k for k in payload if k != ADAPTER_CONFIG_KEY}
    if given != set(params):
        raise KeyError(
            "the checkpoint's LoRA adapter does not match this run's (--lora-rank / --lora-target-modules): "
            f"missing {sorted(set(params) - given)[:4]}, unexpected {sorted(given - set(params))[:4]}"
        )
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(payload[name])


@torch.no_grad()
def merge_adapter(model: torch.nn.Module, payload: Mapping[str, torch.Tensor]) -> None:
    """Set every adapted weight of a plain transformers ``model`` to ``W_base + (B @ A) * scaling``
    (computed in float32, cast to the weight's dtype and device)."""
    scaling = adapter_settings(payload)["scaling"]
    params = dict(model.named_parameters())
    base = model.__dict__.setdefault(_BASE_ATTR, {})
    for layer in _layers(payload):
        target = params.get(f"{layer}.weight")
        if target is None:
            raise KeyError(f"LoRA adapter for {layer!r}: the model has no parameter {layer}.weight")
        if layer not in base:
            base[layer] = target.detach().clone()
        a, b = payload[f"{layer}.lora_A.weight"].float(), payload[f"{layer}.lora_B.weight"].float()
        merged = base[layer].float() + (b.to(target.device) @ a.to(target.device)) * scaling
        target.copy_(merged.to(target.dtype))


def save_adapter(payload: Mapping[str, torch.Tensor], directory: str | os.PathLike, *,
                 base_model: str | os.PathLike | None = None) -> Path:
    """The adapter in PEFT's format (``adapter_config.json`` + ``adapter_model.safetensors``), loadable
    with ``peft.PeftModel.from_pretrained(base, directory)``."""
    peft = require_peft()
    from safetensors.torch import save_file

    settings = adapter_settings(payload)
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    config = peft.LoraConfig(r=settings["r"], lora_alpha=settings["lora_alpha"], lora_dropout=settings["lora_dropout"],
                             target_modules=settings["target_modules"], bias="none", task_type="CAUSAL_LM",
                             base_model_name_or_path=str(base_model) if base_model else None)
    config.save_pretrained(str(out))
    tensors = {_PEFT_PREFIX + k: v.contiguous() for k, v in payload.items() if k != ADAPTER_CONFIG_KEY}
    save_file(tensors, str(out / "adapter_model.safetensors"))
    return out
