"""LoRA with the vLLM engine: the trainer sends an adapter payload (``relax.models.hf.lora``), and the
engine loads the checkpoint's weights with the adapter merged in, ``W = W_base + (B @ A) * scaling``
(the same expression as ``merge_adapter``), always into the *base* weights, never on top of the
previous merge. The base weights are read from the checkpoint once, on the first payload.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import torch


def checkpoint_weights_reader(path: Path) -> Callable[[], dict[str, torch.Tensor]]:
    """A function returning the checkpoint's weights (read on the first call, then kept)."""
    cache: dict[str, torch.Tensor] = {}

    def read() -> dict[str, torch.Tensor]:
        if not cache:
            from safetensors.torch import load_file

            files = sorted(Path(path).glob("*.safetensors"))
            if not files:
                raise FileNotFoundError(f"--hf-checkpoint {path}: no *.safetensors weights to merge LoRA into")
            for file in files:
                cache.update(load_file(str(file)))
        return cache

    return read


@torch.no_grad()
def merged_weights(base: Mapping[str, torch.Tensor], payload: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every base weight, with each adapted layer's weight replaced by its merge (float32 math,
    cast back to the base weight's dtype)."""
    from relax.models.hf.lora import ADAPTER_CONFIG_KEY, adapter_settings

    scaling = adapter_settings(payload)["scaling"]
    out = dict(base)
    layers = sorted(k.removesuffix(".lora_A.weight") for k in payload if k.endswith(".lora_A.weight"))
    for layer in layers:
        name = f"{layer}.weight"
        if name not in base:
            raise KeyError(f"LoRA adapter for {layer!r}: the checkpoint has no weight {name}")
        a = payload[f"{layer}.lora_A.weight"].float()
        b = payload[f"{layer}.lora_B.weight"].float()
        out[name] = (base[name].float() + (b @ a) * scaling).to(base[name].dtype)
    out.pop(ADAPTER_CONFIG_KEY, None)
    return out
