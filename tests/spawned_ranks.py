"""Run one function on several spawned processes (the ranks of a gloo group) and collect what each
reports, for the tests of distributed code. A rank that never reports fails the test through the join
timeout instead of hanging the suite; every process is gone when the call returns."""

from __future__ import annotations

import multiprocessing as mp
import queue as queue_module
import socket

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_ranks(run_rank, world: int, *args, join_timeout_s: float) -> tuple[dict, list[int | None]]:
    """``run_rank(rank, port, queue, *args)`` on ``world`` spawned processes; each puts
    ``(rank, result)`` on the queue once. Returns ``({rank: result}, exit codes)``; a result holding
    ``"__fatal__"`` (a rank's own report of an exception) fails the test with it."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=run_rank, args=(r, port, q, *args)) for r in range(world)]
    for p in procs:
        p.start()
    out = {}
    try:
        for _ in procs:
            rank, res = q.get(timeout=join_timeout_s)
            out[rank] = res
    except queue_module.Empty:
        pytest.fail(f"a rank did not report within {join_timeout_s}s (hang?); got ranks {sorted(out)}")
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    for rank in range(world):
        assert "__fatal__" not in out[rank], out[rank]["__fatal__"]
    return out, [p.exitcode for p in procs]
