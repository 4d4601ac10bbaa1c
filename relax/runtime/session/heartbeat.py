"""Heartbeats: whether a worker still makes progress, not only whether its process exists.

A Ray actor that is stuck (stopped with SIGSTOP, swapped out, caught in a kernel call, a deadlock
holding the GIL) is not dead: Ray keeps its calls pending until its own health check gives up,
minutes later, and then reports it as "unavailable". So every worker runs a small daemon thread that
counts up a beat in Ray's key-value store (the GCS, no extra process) every ``BEAT_INTERVAL_S``,
with its pid and the place its task thread is in. The driver reads the beats while it waits
(``relax.runtime.session.waits``) and notes, on its own clock, when each one last changed: a worker whose
beat has not changed for ``--worker-timeout`` seconds is reported by role, rank, pid, where it was
and for how long, and the run ends. The thread is started through Ray's ``__ray_call__``, queued
behind the worker's ``__init__``, so the worker classes need no code for it.

A worker's own process state (``/proc/<pid>/stat``: stopped, in uninterruptible sleep, zombie) is
added to the message when the worker runs on the driver's machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field

from relax.runtime.step.exit_guard import RELAX_DIR, is_library

BEAT_INTERVAL_S = 1.0
NAMESPACE = "relax_heartbeat"


def where(thread_ident: int) -> str:
    """Where the thread ``thread_ident`` is: the relax (or user) method it entered and the
    innermost relax or user frame, or ``idle`` when it runs neither (waiting for its next call)."""
    frame = sys._current_frames().get(thread_ident)
    entry, inner = None, None
    while frame is not None:
        code = frame.f_code
        if not is_library(code.co_filename):
            here = f"{os.path.relpath(code.co_filename, os.path.dirname(RELAX_DIR.rstrip(os.sep)))}:{frame.f_lineno}"
            inner = inner or f"{code.co_qualname} ({here})"
            entry = code.co_qualname
        frame = frame.f_back
    if inner is None:
        return "idle (between calls)"
    return inner if entry == inner.split(" ", 1)[0] else f"{entry} -> {inner}"


def start_beating(instance, key: str, interval: float = BEAT_INTERVAL_S) -> tuple[int, str, float]:
    """Run inside a worker (through ``handle.__ray_call__``): start the beat thread for the thread
    that runs the worker's calls (this one); returns ``(pid, node ip, time.time())``, the last
    telling when the worker's ``__init__`` ended."""
    done = time.time()
    import ray
    from ray.experimental import internal_kv

    task_thread = threading.get_ident()
    pid = os.getpid()

    def beat() -> None:
        count = 0
        while True:
            count += 1
            payload = json.dumps({"beat": count, "pid": pid, "where": where(task_thread)})
            # A failed put (the GCS busy or gone) is not retried: the next beat is a new one.
            with contextlib.suppress(Exception):
                internal_kv._internal_kv_put(key, payload, overwrite=True, namespace=NAMESPACE)
            time.sleep(interval)

    threading.Thread(target=beat, name="relax-heartbeat", daemon=True).start()
    return pid, ray.util.get_node_ip_address(), done


def process_state(pid: int | None, node_ip: str | None) -> str | None:
    """What ``/proc`` says about ``pid`` when it runs on this machine (else None)."""
    if pid is None:
        return None
    try:
        if node_ip is not None:
            import ray

            if node_ip != ray.util.get_node_ip_address():
                return None
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError, ImportError):
        return None
    return {
        "T": "its process is stopped (state T: SIGSTOP, or a debugger)",
        "t": "its process is stopped by a debugger (state t)",
        "D": "its process is in uninterruptible sleep (state D: disk, network file system or swap)",
        "Z": "its process has exited (zombie)",
    }.get(state)


@dataclass
class Worker:
    """One watched worker: its name (``rollout worker 0``, ``actor rank 1``) and last beat."""

    name: str
    handle: object
    key: str
    pid: int | None = None
    node_ip: str | None = None
    beat: int = -1
    where: str = "starting"
    changed: float = field(default_factory=time.monotonic)

    def describe(self) -> str:
        at = f"pid {self.pid}" if self.pid is not None else "pid unknown"
        return f"the {self.name} ({at}{f' on {self.node_ip}' if self.node_ip else ''})"


class Heartbeats:
    """The driver's view of every worker's beat."""

    def __init__(self, timeout: float):
        self.timeout = timeout
        self.run_key = uuid.uuid4().hex[:12]
        self.workers: list[Worker] = []
        self._reported: dict[str, float] = {}

    def install(self, named_handles: list[tuple[str, object]]) -> list:
        """Queue the beat thread's start on every worker (behind its ``__init__``); returns the
        references to wait for (then pass their results to ``started``)."""
        refs = []
        for name, handle in named_handles:
            worker = Worker(name, handle, f"{self.run_key}/{len(self.workers)}")
            self.workers.append(worker)
            refs.append(handle.__ray_call__.remote(start_beating, worker.key))
        return refs

    def started(self, results: list[tuple[int, str]]) -> None:
        now = time.monotonic()
        for worker, (pid, node_ip) in zip(self.workers, results):
            worker.pid, worker.node_ip, worker.changed = pid, node_ip, now

    def forget(self) -> None:
        """Drop the run's beats from the key-value store (a kept cluster outlives the run)."""
        from ray.experimental import internal_kv

        with contextlib.suppress(Exception):
            internal_kv._internal_kv_del(f"{self.run_key}/", del_by_prefix=True, namespace=NAMESPACE)

    def silent_pids_on_this_machine(self) -> list[int]:
        """The pids of the silent workers (``silent``) that run on this machine."""
        try:
            import ray

            here = ray.util.get_node_ip_address()
            quiet = self.silent()
        except Exception:  # noqa: BLE001 - Ray already gone: nothing to tell
            return []
        return [w.pid for w, _ in quiet if w.node_ip in (None, here)]

    def silent(self) -> list[tuple[Worker, float]]:
        """``[(worker, seconds since its beat last changed)]`` for the workers silent for more
        than three beats, most silent first."""
        from ray.experimental import internal_kv

        now = time.monotonic()
        for worker in self.workers:
            try:
                raw = internal_kv._internal_kv_get(worker.key, namespace=NAMESPACE)
            except Exception:  # noqa: BLE001 - the GCS itself does not answer: nothing to tell apart
                return []
            if raw is None:
                continue
            payload = json.loads(raw)
            if payload["beat"] != worker.beat:
                worker.beat, worker.where, worker.changed = payload["beat"], payload["where"], now
        quiet = [(w, now - w.changed) for w in self.workers if w.pid is not None and now - w.changed > 3 * BEAT_INTERVAL_S]
        return sorted(quiet, key=lambda pair: -pair[1])

    def places(self) -> str:
        """Where each worker's task thread is, as its latest beat says (for a step without progress:
        user code that never returns shows up here by name, file and line)."""
        with contextlib.suppress(Exception):
            self.silent()  # reads the latest beats
        return "; ".join(f"{w.name} in {w.where}" for w in self.workers)

    def still_waiting_lines(self, waiting_for: str) -> list[str]:
        """A "still waiting" line for each worker silent for a third of the timeout or more, at
        most once per third of the timeout per worker."""
        lines, now = [], time.monotonic()
        step = self.timeout / 3
        for worker, quiet in self.silent():
            if quiet < step or now - self._reported.get(worker.key, -step) < step:
                continue
            self._reported[worker.key] = now
            state = process_state(worker.pid, worker.node_ip)
            lines.append(
                f"relax: still waiting for {waiting_for}: {worker.describe()} has not answered for {quiet:.0f}s "
                f"(it was in {worker.where}{'; ' + state if state else ''}); the run ends at {self.timeout:.0f}s "
                "(--worker-timeout)"
            )
        return lines

    def unresponsive(self) -> str | None:
        """The error message for the most silent worker past the timeout, else None."""
        for worker, quiet in self.silent():
            if quiet >= self.timeout:
                state = process_state(worker.pid, worker.node_ip)
                return (
                    f"{worker.describe()} stopped responding: no heartbeat for {quiet:.0f}s (--worker-timeout "
                    f"{self.timeout:g}); it was in {worker.where}{'; ' + state if state else ''}. It did not die: "
                    "relax stops it with the run. Restart the run, with --load to resume from the last checkpoint, "
                    "or raise --worker-timeout if the machine is that overloaded"
                )
        return None
