"""Megatron's process groups on top of ``torch.distributed``: a one-process group when the caller
started none, then megatron-core's tensor/pipeline/data-parallel groups over it."""

from __future__ import annotations

import socket

import torch.distributed as dist

from relax.backends.megatron import placement


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_distributed(timeout_s: float = 120.0) -> None:
    """Start a single-process group when the caller did not start one (NCCL on CUDA, else gloo)."""
    if dist.is_initialized():
        return
    import datetime

    dist.init_process_group(
        placement.process_group_backend(),
        init_method=f"tcp://127.0.0.1:{_free_port()}",
        rank=0,
        world_size=1,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


def init_parallel_state(tp_size: int, pp_size: int, seed: int) -> None:
    """Megatron's process groups (global state; a second backend in the process must agree on sizes)."""
    from megatron.core import parallel_state, tensor_parallel

    world = dist.get_world_size()
    if world % (tp_size * pp_size):
        raise ValueError(
            f"world size {world} is not a multiple of --tensor-model-parallel-size {tp_size} x "
            f"--pipeline-model-parallel-size {pp_size}"
        )
    if parallel_state.model_parallel_is_initialized():
        have = (
            parallel_state.get_tensor_model_parallel_world_size(),
            parallel_state.get_pipeline_model_parallel_world_size(),
        )
        if have != (tp_size, pp_size):
            raise RuntimeError(f"Megatron parallel state already initialized with (tp, pp) = {have}, not {(tp_size, pp_size)}")
    else:
        parallel_state.initialize_model_parallel(tp_size, pp_size)
    # Dropout is 0 in RL training, so the inference tracker (fork() is a no-op) is exact, and it
    # needs no CUDA RNG state.
    tensor_parallel.model_parallel_cuda_manual_seed(seed, inference_rng_tracker=True, force_reset_rng=True)
