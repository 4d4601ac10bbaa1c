"""Where a Megatron rank trains: its CUDA device when torch sees one, else the CPU.

megatron-core places much of what it allocates on ``torch.cuda.current_device()`` (the DDP gradient
buffers, the optimizer's scale and norm tensors, the attention scratch buffer, rotary tables), so on a
GPU the rank's device must be made *current* before Megatron builds anything, and the model, its
inputs and everything the backend creates must live there too. Without CUDA the same code runs on
the CPU through ``_cpu_compat``, which is applied there only: its patches rewrite ``torch.cuda``
calls and would misplace tensors on a machine that has a GPU.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from relax.backends.megatron import _cpu_compat


def local_device_index() -> int:
    """This rank's CUDA device among the visible ones.

    Under Ray each actor sees only the GPU it was given (``CUDA_VISIBLE_DEVICES``), so there is one
    and it is device 0. A launcher that starts one process per GPU of a node (torchrun) says which
    with ``LOCAL_RANK``. Otherwise, several visible GPUs are shared out by the global rank."""
    count = torch.cuda.device_count()
    if count < 1:
        raise RuntimeError("CUDA is available but torch sees no CUDA device")
    local_rank = os.environ.get("LOCAL_RANK")
    if local_rank is not None:
        return int(local_rank) % count
    rank = dist.get_rank() if dist.is_initialized() else 0
    return rank % count


def training_device() -> torch.device:
    """The device this rank trains on, made current on CUDA (before any Megatron allocation)."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    index = local_device_index()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def prepare_megatron(device: torch.device) -> None:
    """What megatron-core needs before it runs on ``device``: on the CPU the compatibility patches;
    on CUDA none (a CPU-only patch there would put Megatron's buffers on the wrong device), only
    the check that this is the megatron-core version the backend was written against."""
    if device.type == "cpu":
        _cpu_compat.apply()
    else:
        _cpu_compat.check_version()


def process_group_backend() -> str:
    """The ``torch.distributed`` backend for Megatron ranks: NCCL between GPUs, else gloo."""
    return "nccl" if torch.cuda.is_available() else "gloo"
