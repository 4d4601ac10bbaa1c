"""Running untrusted programs (model-written code) in an isolated, limited subprocess.

``run_sandboxed(files, argv, limits)`` writes ``files`` into a fresh scratch directory, runs ``argv``
there through ``_sandbox_boot.py`` and returns its exit status and output. What the program gets
(Linux only; docs/en/rewards.md):

- **no network**: a new network namespace with nothing in it;
- **writes only to its scratch directory**: every other mount is read-only in its mount namespace
  (``/tmp``, ``/dev/shm`` and world-writable directories too); the directory is deleted afterwards;
- **an unprivileged user** when relax runs as root: uid/gid of ``nobody`` (65534), no groups, so it
  cannot read files only root may read. When relax is not root it runs as relax's own user inside a
  user namespace: isolated from the network and the file system the same way, but it can read what
  relax can read and signal relax's processes;
- **limits**: CPU seconds, address space, file size, process count (``SandboxLimits``), and a
  wall-clock timeout;
- **nothing outlives it**: the program runs in a new PID namespace whose process 1 is the boot
  program's; when the program's first process ends (or at the wall-clock timeout) the namespace is
  ended, and the kernel kills and reaps every process in it (forked, ``setsid``, daemonised) before
  ``run_sandboxed`` returns.

Not isolated: CPU time is limited per process only, and where the kernel forbids a new ``/proc``
mount (some containers) the program sees the host's process list, though it cannot signal it. A sandbox that cannot be built (no namespaces on this machine) raises ``SandboxError``: the
program is never run without isolation.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs

BOOT = Path(__file__).with_name("_sandbox_boot.py")
BOOT_FAILED = 120  # _sandbox_boot.BOOT_FAILED
NOBODY = 65534
STOP_GRACE_SECONDS = 5.0


class SandboxError(RuntimeError):
    """The sandbox itself could not be built (as opposed to the program failing inside it)."""


@attrs.frozen(kw_only=True)
class SandboxLimits:
    cpu_seconds: int = 5
    wall_seconds: float = 10.0
    memory_bytes: int = 1 << 30
    file_bytes: int = 16 << 20
    processes: int = 64  # per user: concurrent sandboxes of the same user share it
    output_bytes: int = 1 << 20  # stdout / stderr kept (the rest is dropped)

    def __attrs_post_init__(self):
        for name in ("cpu_seconds", "wall_seconds", "memory_bytes", "file_bytes", "processes",
                     "output_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SandboxLimits.{name} must be > 0, got {getattr(self, name)!r}")


@attrs.frozen
class SandboxResult:
    returncode: int  # negative: killed by that signal
    stdout: str
    stderr: str
    timed_out: bool  # killed by the wall-clock timeout
    seconds: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


def _reachable_by_others(path: str) -> bool:
    """Whether a user other than the owner can traverse to ``path`` and execute/read it."""
    real = Path(os.path.realpath(path))
    for part in [real, *real.parents]:
        try:
            if not os.stat(part).st_mode & stat.S_IXOTH:
                return False
        except OSError:
            return False
    return True


def default_interpreter() -> str:
    """A Python the sandbox user can run: this one, or the system's ``python3`` when this one lies
    where ``nobody`` cannot reach (e.g. under ``/root``). The program gets the standard library only."""
    if os.geteuid() != 0:
        return sys.executable
    candidates = [sys.executable, shutil.which("python3") or "", "/usr/bin/python3"]
    for candidate in candidates:
        if candidate and _reachable_by_others(candidate):
            base = sys.base_prefix if candidate == sys.executable else "/usr"
            if _reachable_by_others(base):
                return candidate
    raise SandboxError(
        f"no Python interpreter that the sandbox user (uid {NOBODY}) can run: {sys.executable} lies in a "
        "directory others cannot enter; install python3 system-wide or pass interpreter= explicitly"
    )


def _head(file, limit: int) -> str:
    file.seek(0)
    return file.read(limit).decode(errors="replace")


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _stop(proc: subprocess.Popen) -> None:
    """End a sandbox at its wall-clock limit. SIGTERM makes the boot program kill its PID namespace
    and return only once every process in it is gone; SIGKILL of its group is the fallback for a
    boot program that does not answer (e.g. still building the namespaces)."""
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=STOP_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        proc.wait()


def run_sandboxed(files: Mapping[str, str], argv: Sequence[str], limits: SandboxLimits | None = None,
                  stdin: str = "") -> SandboxResult:
    """Run ``argv`` (``argv[0]`` an absolute executable path) in a new scratch directory holding
    ``files`` (name -> text), isolated and limited as described in the module docstring."""
    limits = limits or SandboxLimits()
    if not sys.platform.startswith("linux"):
        raise SandboxError(f"the code sandbox needs Linux namespaces; this is {sys.platform}")
    as_root = os.geteuid() == 0
    scratch = tempfile.mkdtemp(prefix="relax-sandbox-")
    try:
        for name, text in files.items():
            Path(scratch, name).write_text(text)
        if as_root:
            for entry in [scratch, *(os.path.join(scratch, n) for n in files)]:
                os.chown(entry, NOBODY, NOBODY)
        config = {
            "scratch": os.path.realpath(scratch), "argv": list(argv), "uid": NOBODY, "gid": NOBODY,
            "cpu_seconds": limits.cpu_seconds, "memory_bytes": limits.memory_bytes,
            "file_bytes": limits.file_bytes, "processes": limits.processes,
        }
        # Output goes to files, not pipes: RLIMIT_FSIZE caps them, so a program printing without end
        # is stopped at file_bytes instead of filling relax's memory.
        with tempfile.TemporaryFile() as out_file, tempfile.TemporaryFile() as err_file:
            start = time.monotonic()
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", str(BOOT), json.dumps(config)],
                stdin=subprocess.PIPE, stdout=out_file, stderr=err_file,
                cwd=scratch, start_new_session=True, env={"PATH": "/usr/bin:/bin"},
            )
            timed_out = False
            try:
                proc.communicate(stdin.encode(), timeout=limits.wall_seconds)
            except subprocess.TimeoutExpired:
                timed_out = True
                _stop(proc)
            finally:
                _kill_group(proc)  # the boot program's group, should it have left anything
            seconds = time.monotonic() - start
            out, err = (_head(f, limits.output_bytes) for f in (out_file, err_file))
        if proc.returncode == BOOT_FAILED and err.startswith("relax sandbox:"):
            raise SandboxError(err.strip() + " (is this a container without namespace support?)")
        return SandboxResult(proc.returncode, out, err, timed_out, seconds)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
