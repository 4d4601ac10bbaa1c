"""The output directory of a run: refuse to write over another run, and hold a lock while running.

A directory *holds a run* when it has a non-empty ``metrics.jsonl`` or a checkpoint under
``checkpoints/``. ``relax train`` refuses such a directory unless the run resumes (``--load``) or
``--overwrite-output-dir`` is given; with the latter, the old run's ``metrics.jsonl`` and
``checkpoints/`` are deleted before the new run writes (other files are left alone).

While a run writes, it holds an exclusive ``fcntl`` lock on ``<output_dir>/.relax.lock``; the file
records the holder's process id, host and command line, so a second run started on the same
directory is refused with a message naming both. The kernel drops the lock when the holder exits,
however it exits (a stale lock file is harmless); a run that ends normally deletes the file. Locks are re-entrant within one process: the CLI
takes the lock before it writes ``config.yaml`` and ``run(config)`` takes it again.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import sys
import weakref
from pathlib import Path

LOCK_NAME = ".relax.lock"
METRICS_NAME = "metrics.jsonl"
CHECKPOINTS_NAME = "checkpoints"


class RunDirError(RuntimeError):
    """The output directory cannot be used by this run; the message says why and what to do."""


def _is_training_row(line: str) -> bool:
    """A line of a training step: not blank, not the evaluation before training (logged as step 0,
    relax.runtime.driver.evaluation); a line that is not JSON counts (it is still another run's output)."""
    if not line.strip():
        return False
    try:
        return json.loads(line).get("step") != 0
    except (ValueError, AttributeError):
        return True


def _holds_run(path: Path) -> str | None:
    """A description of the run ``path`` holds ("metrics.jsonl with 20 steps, 2 checkpoints"), or None."""
    parts = []
    metrics = path / METRICS_NAME
    if metrics.is_file() and metrics.stat().st_size > 0:
        try:
            rows = sum(map(_is_training_row, metrics.read_text(errors="replace").splitlines()))
        except OSError:
            rows = 0
        parts.append(f"{METRICS_NAME} with {rows} step{'s' if rows != 1 else ''}")
    checkpoints = sorted((path / CHECKPOINTS_NAME).glob("step_*/state.pt"))
    if checkpoints:
        parts.append(f"{len(checkpoints)} checkpoint{'s' if len(checkpoints) != 1 else ''}")
    return ", ".join(parts) or None


def has_checkpoint(path: Path) -> bool:
    return any((Path(path) / CHECKPOINTS_NAME).glob("step_*/state.pt"))


def _nearest_existing(path: Path) -> Path:
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def run_of_checkpoint(load) -> Path | None:
    """The run directory a ``--load`` path belongs to (``<run>/checkpoints/step_*/state.pt``), or None
    for a checkpoint file kept elsewhere."""
    p = Path(load)
    if p.is_file():
        ckpt = p
    elif (p / "state.pt").is_file():
        ckpt = p / "state.pt"
    elif has_checkpoint(p):
        return p
    else:
        return None
    if ckpt.parent.name.startswith("step_") and ckpt.parent.parent.name == CHECKPOINTS_NAME:
        return ckpt.parents[2]
    return None


def _resumes_in_place(path: Path, load) -> bool:
    """Whether ``--load load`` continues the run in ``path`` (True when only a bool is known)."""
    if isinstance(load, bool):
        return load
    owner = run_of_checkpoint(load)
    return owner is not None and owner.resolve() == Path(path).resolve()


def check_output_dir(path, *, resuming: bool | str = False, overwrite: bool = False) -> None:
    """Raise ``RunDirError`` when a run may not write to ``path``. Creates nothing.

    ``resuming``: the run was given ``--load`` (the path, or True); it may continue the run in
    ``path`` itself, never write into another run's directory; ``overwrite``: ``--overwrite-output-dir``.
    """
    path = Path(path)
    flag = f"--output-dir {path}"
    if path.exists() and not path.is_dir():
        raise RunDirError(f"{flag} is a file, not a directory; pass the path of a directory (new or existing)")
    existing = _nearest_existing(path)
    if not existing.is_dir():
        raise RunDirError(f"{flag}: {existing} is a file, so the directory cannot be created; choose another path")
    if not os.access(existing, os.W_OK | os.X_OK):
        what = "the directory" if existing == path.absolute() else f"its parent {existing}"
        raise RunDirError(f"{flag}: {what} is not writable by this user; choose a writable --output-dir")
    holder = lock_holder(path)
    if holder is not None:
        raise RunDirError(
            f"{flag} is in use by another relax run ({holder}); wait for it to finish or choose another "
            "--output-dir"
        )
    run = _holds_run(path) if path.is_dir() else None
    if run is not None and resuming and not isinstance(resuming, bool) and not overwrite:
        owner = run_of_checkpoint(resuming)
        if owner is None and not Path(resuming).is_file() and not (Path(resuming) / "state.pt").is_file():
            raise RunDirError(
                f"--load {resuming}: no checkpoint there (the run in it stopped before it saved one); start "
                f"it again with --overwrite-output-dir, or choose another --output-dir"
            )
        if not _resumes_in_place(path, resuming):
            source = f"the run in {owner}" if owner is not None else "a checkpoint kept outside any run directory"
            fixes = f"pass --output-dir {owner} to continue that run in place, or" if owner is not None else "pass"
            raise RunDirError(
                f"{flag} already holds another run ({run}) and --load {resuming} resumes {source}; resuming "
                f"into {path} would write over that run's metrics: {fixes} a new --output-dir"
            )
    if run is not None and not resuming and not overwrite:
        fixes = ["choose another --output-dir"]
        if has_checkpoint(path):
            fixes.append(f"add --load {path} to resume it")
        fixes.append("pass --overwrite-output-dir to delete its metrics and checkpoints")
        raise RunDirError(
            f"{flag} already holds a run ({run}); relax never writes over a run: " + ", ".join(fixes[:-1])
            + f" or {fixes[-1]}"
        )


def clear_old_run(path) -> None:
    """``--overwrite-output-dir``: delete the previous run's metrics and checkpoints in ``path``."""
    path = Path(path)
    (path / METRICS_NAME).unlink(missing_ok=True)
    shutil.rmtree(path / CHECKPOINTS_NAME, ignore_errors=True)


# -- the lock ------------------------------------------------------------------------------------


class RunDirLock:
    """An exclusive lock on ``<path>/.relax.lock``, held until ``release()`` or garbage collection."""

    def __init__(self, path: Path, fd: int):
        self.path = path
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            try:
                # removed while still held, so no other run can have opened this file and be waiting
                # for it (lock_run_dir checks it locked the file the path names)
                with contextlib.suppress(OSError):
                    (self.path / LOCK_NAME).unlink()
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            finally:
                os.close(self._fd)
                self._fd = None
                _HELD.pop(_key(self.path), None)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __del__(self):
        with contextlib.suppress(Exception):  # at interpreter shutdown os/fcntl may be gone already
            self.release()


_HELD: weakref.WeakValueDictionary[str, RunDirLock] = weakref.WeakValueDictionary()


def _key(path: Path) -> str:
    return str(Path(path).resolve())


def _describe_holder(text: str) -> str:
    info = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    if not info.get("pid"):
        return "a process that left no details"
    where = f"pid {info['pid']}" + (f" on {info['host']}" if info.get("host") else "")
    return where + (f": {info['command']}" if info.get("command") else "")


def lock_holder(path) -> str | None:
    """Who holds ``path``'s run lock (another process), or None. Creates nothing."""
    path = Path(path)
    lock_file = path / LOCK_NAME
    if not lock_file.is_file():
        return None
    held = _HELD.get(_key(path))
    if held is not None and held.held:
        return None  # this process holds it
    try:
        fd = os.open(lock_file, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _describe_holder(lock_file.read_text(errors="replace"))
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _lock_file(path: Path) -> int:
    """Create and exclusively lock ``<path>/.relax.lock``; returns its descriptor. The holder deletes
    the file when it releases it, so a lock taken on a file that was deleted meanwhile is retried."""
    for _ in range(10):
        try:
            path.mkdir(parents=True, exist_ok=True)
            fd = os.open(path / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise RunDirError(f"--output-dir {path}: cannot create it ({exc.strerror or exc})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunDirError(
                f"--output-dir {path} is in use by another relax run ({lock_holder(path) or 'another process'}); "
                "wait for it to finish or choose another --output-dir"
            ) from None
        try:
            if os.fstat(fd).st_ino == os.stat(path / LOCK_NAME).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)  # the previous holder deleted this file as we locked it: take the new one
    raise RunDirError(f"--output-dir {path}: could not take its lock file {LOCK_NAME}; try again")


def lock_run_dir(path, *, resuming: bool | str = False, overwrite: bool = False) -> RunDirLock:
    """Check ``path`` (``check_output_dir``), create it, take its lock and, with ``overwrite``, clear the
    old run. Keep the returned object alive while the run writes. Re-entrant within one process."""
    path = Path(path)
    held = _HELD.get(_key(path)) if path.exists() else None
    if held is not None and held.held:
        return held
    check_output_dir(path, resuming=resuming, overwrite=overwrite)
    fd = _lock_file(path)
    os.ftruncate(fd, 0)
    command = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) if sys.argv and sys.argv[0] else ""
    os.write(fd, f"pid={os.getpid()}\nhost={socket.gethostname()}\ncommand={command[:300]}\n".encode())
    lock = RunDirLock(path, fd)
    _HELD[_key(path)] = lock
    if overwrite and (not resuming or not _resumes_in_place(path, resuming)):
        clear_old_run(path)
    return lock
