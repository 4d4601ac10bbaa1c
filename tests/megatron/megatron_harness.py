"""Spawned multi-process gloo runs for the Megatron tests.

Megatron keeps process-global state (parallel groups, RNG tracker) and the CPU compatibility module
patches ``torch.cuda``, so every check runs in fresh spawned processes, never in the pytest process.
Each spawn pays ~5 s of imports: group several checks per spawn.
"""

from __future__ import annotations

import datetime
import os
import socket
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, fn, world_size, port, out_dir, args, pg_backend="gloo"):
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"
    dist.init_process_group(
        pg_backend,
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=90),
    )
    try:
        result = fn(rank, world_size, *args)
        torch.save(result, os.path.join(out_dir, f"{rank}.pt"))
    finally:
        dist.destroy_process_group()


def run_distributed(fn, world_size: int, *args, pg_backend: str = "gloo") -> list:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` spawned ranks (gloo; ``pg_backend="nccl"``
    for GPU ranks); return each rank's result.

    ``fn`` must be a module-level function (spawn pickles it by name). An exception on any rank is
    re-raised here (torch terminates the other ranks).
    """
    with tempfile.TemporaryDirectory() as out_dir:
        mp.start_processes(
            _entry,
            args=(fn, world_size, _free_port(), out_dir, args, pg_backend),
            nprocs=world_size,
            join=True,
            start_method="spawn",
        )
        return [torch.load(os.path.join(out_dir, f"{r}.pt"), weights_only=False) for r in range(world_size)]
