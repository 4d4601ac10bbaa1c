"""No Ray process of a run outlives it.

``ray.shutdown()`` stops the processes of a cluster the driver started, but not all of them in every
case: a worker stopped with SIGSTOP cannot notice that its raylet is gone, and after a SIGKILL of the
driver Ray's agents (``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``) stay behind with parent 1.
So a run that starts its own cluster

- sweeps, after ``ray.shutdown()``, every Ray process still below the driver (``sweep``), and
- starts a watchdog (``python -m relax.runtime.session.reaper``, standard library only, in its own session so
  that Ctrl-C does not reach it) that notes the driver's Ray processes every second and kills them
  when the driver dies without saying goodbye (SIGKILL, a crash). A driver that ends normally closes
  the watchdog's stdin after writing ``BYE``.

Linux only (``/proc``); elsewhere both are no-ops. A process is identified by its pid *and* its start
time, so a recycled pid is never killed.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys

BYE = b"bye\n"
SNAPSHOT_INTERVAL_S = 1.0
RAY_MARKERS = ("ray::", "raylet", "gcs_server", "/ray/", "default_worker.py")


def _stat(pid: int) -> tuple[int, int, str] | None:
    """``(parent pid, start time, state)`` of ``pid``, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), int(fields[19]), fields[0]


def is_ray(pid: int, markers: tuple[str, ...] = RAY_MARKERS) -> bool:
    """Whether process ``pid``'s command line is one of Ray's (by ``markers``)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return any(marker in cmdline for marker in markers)


def descendants(root: int, only_ray: bool = True) -> dict[int, int]:
    """``{pid: start time}`` of every process below ``root`` (Ray processes only, by default)."""
    children: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if entry.isdigit() and (stat := _stat(int(entry))) is not None:
            children.setdefault(stat[0], []).append(int(entry))
            starts[int(entry)] = stat[1]
    found, todo = {}, list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if pid in found or pid not in starts:
            continue
        found[pid] = starts[pid]
        todo += children.get(pid, [])
    return {pid: start for pid, start in found.items() if not only_ray or is_ray(pid)}


def kill(processes: dict[int, int]) -> list[int]:
    """SIGKILL each ``{pid: start time}`` that is still that process; returns the pids killed."""
    killed = []
    for pid, start in processes.items():
        stat = _stat(pid)
        if stat is None or stat[1] != start or stat[2] == "Z":
            continue
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except OSError:
            pass
    return killed


def kill_pids(pids: list[int]) -> list[int]:
    """SIGKILL the Ray processes among ``pids`` (a run's own workers); returns the pids killed."""
    return kill({p: stat[1] for p in pids if (stat := _stat(p)) is not None and is_ray(p)})


def sweep(exclude: tuple[int, ...] = ()) -> list[int]:
    """Kill the Ray processes still below this process (after ``ray.shutdown()``)."""
    return kill({p: s for p, s in descendants(os.getpid()).items() if p not in exclude})


class Watchdog:
    """The driver's side of the watchdog process."""

    def __init__(self):
        self.process: subprocess.Popen | None = None
        if not os.path.isdir("/proc"):
            return
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "relax.runtime.session.reaper", str(os.getpid())],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C in the terminal reaches the driver, not the watchdog
            )
        except OSError:
            self.process = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def close(self) -> None:
        """The driver ends normally: the watchdog exits without killing anything."""
        if self.process is None:
            return
        try:
            self.process.stdin.write(BYE)
            self.process.stdin.close()
        except OSError:
            pass
        try:
            self.process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.process = None


def _watch(driver: int) -> None:
    """The watchdog's loop: note the driver's Ray processes; when its stdin closes without ``BYE``
    (the driver died), kill the last ones noted and whatever they started since."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    noted: dict[int, int] = {}
    driver_start = (_stat(driver) or (0, 0, ""))[1]
    while True:
        readable, _, _ = select.select([sys.stdin.buffer], [], [], SNAPSHOT_INTERVAL_S)
        if readable:
            data = os.read(sys.stdin.fileno(), 64)
            if data.startswith(BYE):
                return
            if data:
                continue
            break  # end of file without BYE: the driver is gone
        stat = _stat(driver)
        if stat is None or stat[1] != driver_start or stat[2] == "Z":
            break
        noted = {p: s for p, s in descendants(driver).items() if p != os.getpid()}
    for pid in list(noted):  # what the noted processes started since (e.g. a raylet's workers)
        noted.update(descendants(pid))
    kill(noted)


if __name__ == "__main__":
    _watch(int(sys.argv[1]))
