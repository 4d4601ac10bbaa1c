"""Which device each worker's model is on, in words, for the run's start-up line.

A worker reports where its model really is (the backend's or the engine's parameters), not what it
asked Ray for: a worker granted a GPU share whose model stayed on the CPU is the first thing a user
with a GPU needs to see.
"""

from __future__ import annotations

import os

import torch


def model_device(worker) -> torch.device | None:
    """The device of a worker's model: its training backend's, else its rollout engine's."""
    backend = getattr(worker, "backend", None)
    if backend is not None and getattr(backend, "device", None) is not None:
        return torch.device(backend.device)
    engine = getattr(worker, "engine", None)
    if engine is None:
        return None
    if getattr(engine, "device", None) is not None:
        return torch.device(engine.device)
    model = getattr(engine, "model", None)
    if isinstance(model, torch.nn.Module):
        return next(model.parameters()).device
    return None


def describe(device: torch.device | None) -> str:
    """``cuda:0 (NVIDIA H200, CUDA_VISIBLE_DEVICES=3)``, ``cpu`` or ``its engine's own``."""
    if device is None:
        return "its engine's own (device not reported)"
    if device.type != "cuda":
        return device.type
    index = device.index if device.index is not None else torch.cuda.current_device()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    where = f", CUDA_VISIBLE_DEVICES={visible}" if visible else ""
    return f"cuda:{index} ({torch.cuda.get_device_name(index)}{where})"


def placement_line(names: list[str], devices: list[str]) -> str:
    """``relax: devices: rollout0 cuda:0 (...), actor0 cuda:0 (...)``; workers on the same device are
    grouped so that a many-worker run stays one readable line."""
    groups: dict[str, list[str]] = {}
    for name, device in zip(names, devices):
        groups.setdefault(device, []).append(name)
    return "relax: devices: " + "; ".join(f"{', '.join(who)} on {device}" for device, who in groups.items())
