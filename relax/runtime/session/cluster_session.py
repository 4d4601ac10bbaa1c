"""Which processes a kept cluster owns, and stopping exactly those.

``relax cluster up`` starts ``ray start --head`` as the leader of a new session (``setsid``). Every
process Ray then starts (GCS, raylet, dashboard agent, log monitor, Ray's client server, every worker
and actor) inherits that session id, and none of them leaves it; the state file records the session id
and, as anchors, the pid and start time of each process in it right after ``ray start``.

``owned`` answers what ``relax cluster down`` may stop: the processes of that session, plus the
descendants (by parent pid) of those, should user code in a worker have called ``setsid``; never this
process or one of its ancestors (the shell that called ``down``). A process is never chosen for its
command line, so a program that merely names the temp dir (or a sibling dir sharing its prefix) is
safe.

A session id is a pid: the kernel does not hand that number to a new process while any process of the
session lives, so while one member lives the id means our cluster. Once all have died the number may
be reused; a session with no live anchor is therefore only trusted for processes that are Ray's own.

``joined`` answers which processes outside the session use the cluster: a driver that joined it
(``relax train --ray-address``) keeps its Ray log file open in the cluster's temp dir.

Linux only (``/proc``); elsewhere nothing is found and nothing is stopped.
"""

from __future__ import annotations

import os
import signal
import time
from typing import NamedTuple

from relax.runtime.session import reaper

RAY_MARKERS = (*reaper.RAY_MARKERS, "ray.util.client.server")
TERM_GRACE_S = 3.0


class Proc(NamedTuple):
    parent: int
    session: int
    start: int  # clock ticks since boot: (pid, start) names one process, a recycled pid never matches
    state: str


def stat(pid: int) -> Proc | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return Proc(parent=int(fields[1]), session=int(fields[3]), start=int(fields[19]), state=fields[0])


def table() -> dict[int, Proc]:
    """Every live process (zombies aside) of the machine."""
    procs = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if entry.isdigit() and (proc := stat(int(entry))) is not None and proc.state != "Z":
            procs[int(entry)] = proc
    return procs


def members(session: int, procs: dict[int, Proc] | None = None) -> dict[int, int]:
    """``{pid: start}`` of the live processes of ``session``."""
    procs = table() if procs is None else procs
    return {pid: p.start for pid, p in procs.items() if p.session == session}


def anchors_alive(session: int, anchors: dict, procs: dict[int, Proc] | None = None) -> bool:
    """Whether a process recorded at start-up (``{pid: start}``, pids as JSON keys) still lives in it."""
    procs = table() if procs is None else procs
    return any((p := procs.get(int(pid))) is not None and p.start == start and p.session == session
               for pid, start in anchors.items())


def ancestors(pid: int, procs: dict[int, Proc]) -> set[int]:
    found = set()
    while pid > 1 and pid not in found:
        found.add(pid)
        pid = procs[pid].parent if pid in procs else 0
    return found


def is_ray(pid: int) -> bool:
    """Whether process ``pid`` is one of Ray's, its client server included."""
    return reaper.is_ray(pid, RAY_MARKERS)


def owned(session: int, anchors: dict) -> dict[int, int]:
    """``{pid: start}`` of the processes a cluster recorded as (``session``, ``anchors``) owns now."""
    procs = table()
    trusted = anchors_alive(session, anchors, procs)
    found = {pid: start for pid, start in members(session, procs).items() if trusted or is_ray(pid)}
    children: dict[int, list[int]] = {}
    for pid, p in procs.items():
        children.setdefault(p.parent, []).append(pid)
    todo = list(found)
    while todo:  # descendants that left the session (setsid in user code) are still ours
        for child in children.get(todo.pop(), []):
            if child not in found:
                found[child] = procs[child].start
                todo.append(child)
    for pid in ancestors(os.getpid(), procs):
        found.pop(pid, None)
    return found


def _same(pid: int, start: int) -> bool:
    proc = stat(pid)
    return proc is not None and proc.start == start and proc.state != "Z"


def joined(temp_dir: str, owned: dict[int, int]) -> dict[int, int]:
    """``{pid: start}`` of the live processes, not in ``owned`` and not this process or its ancestors,
    that hold a file open under ``temp_dir``: the drivers that joined the cluster."""
    procs = table()
    skip = set(owned) | ancestors(os.getpid(), procs)
    root = os.path.realpath(temp_dir).rstrip("/") + "/"
    found = {}
    for pid, proc in procs.items():
        if pid in skip:
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:  # gone, or not ours to look at
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(root):
                    found[pid] = proc.start
                    break
            except OSError:
                continue
    return found


def wait_gone(processes: dict[int, int], timeout_s: float) -> dict[int, int]:
    """Wait up to ``timeout_s`` for each ``{pid: start}`` to end; returns those still running."""
    deadline = time.monotonic() + timeout_s
    while (left := {p: s for p, s in processes.items() if _same(p, s)}) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def stop(processes: dict[int, int]) -> int:
    """SIGTERM, up to ``TERM_GRACE_S`` to end, then SIGKILL, for each ``{pid: start}`` still that
    process; returns how many were signalled."""
    signalled = 0
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid, start in processes.items():
            if _same(pid, start):
                try:
                    os.kill(pid, sig)
                    signalled += sig == signal.SIGTERM
                except OSError:
                    pass
        if sig == signal.SIGTERM:
            wait_gone(processes, TERM_GRACE_S)
    return signalled
