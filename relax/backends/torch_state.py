"""The torch backend's state as it leaves the process (a checkpoint file, the driver): its keys are
checked on the way back, and every tensor travels as a CPU copy (the receiver may have no GPU)."""

from __future__ import annotations

import copy
from collections.abc import Mapping

import torch


def check_state(state: Mapping) -> None:
    """``TorchBackend.state_dict``'s keys are all there (a checkpoint written by it, replicated or sharded)."""
    missing = {"model", "optimizer", "step"} - set(state)
    if missing:
        raise KeyError(f"TorchBackend state is missing {sorted(missing)}; was it saved by TorchBackend.state_dict()?")


def cpu_copy(state):
    """A deep copy of an optimizer ``state_dict`` with every tensor copied to the CPU."""
    if isinstance(state, torch.Tensor):
        return state.detach().to("cpu", copy=True)
    if isinstance(state, Mapping):
        return {k: cpu_copy(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(cpu_copy(v) for v in state)
    return copy.deepcopy(state)
