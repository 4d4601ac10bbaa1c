"""A failure shown as the user needs it: the exception, the last lines of the user's files it went
through (or, when it never reached the user's code, relax's own file:line where it was raised), the
step and the worker — a few lines, not Ray's whole chain — with the full traceback kept in the run
directory.

Whatever process raised it (a rollout worker calling a reward function or a hook, the actor or the
advantages deployment calling an ``RLAlgorithm`` subclass, the driver), the exception reaches the
driver with its traceback as text (Ray's ``RayTaskError`` carries the worker's formatted chain), so
the frames are read from that text: one rule for every process. A frame is the *user's* when its
file is neither part of relax nor of an installed package or the standard library — installed
wherever the packages are: ``site-packages``, or any directory holding their ``*.dist-info``
(``pip install --target DIR`` on ``PYTHONPATH``, as on a machine without a package index).
"""

from __future__ import annotations

import functools
import importlib.metadata
import re
import sysconfig
import traceback
from pathlib import Path

import attrs

import relax

TRACEBACK_NAME = "error.log"
SHOWN_FRAMES = 3  # the last frames inside the user's files shown on the console

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>.+)$')
_RELAX_DIR = Path(relax.__file__).resolve().parent


@attrs.frozen
class Frame:
    file: str
    line: int
    function: str
    source: str

    def lines(self) -> list[str]:
        head = f'  File "{self.file}", line {self.line}, in {self.function}'
        return [head, f"    {self.source}"] if self.source else [head]


@functools.cache
def _library_dirs() -> tuple[Path, ...]:
    names = ("stdlib", "platstdlib", "purelib", "platlib")
    dirs = {Path(p).resolve() for p in (sysconfig.get_paths().get(n) for n in names) if p}
    # where each installed distribution lives (its *.dist-info's directory): PYTHONPATH entries too
    dirs |= {Path(str(d.locate_file(""))).resolve() for d in importlib.metadata.distributions()
             if not _is_editable(d)}
    return (_RELAX_DIR, *sorted(dirs))


def _is_editable(distribution) -> bool:
    """An editable install's files live in the project, not beside its metadata (a user's own project
    installed with ``pip install -e`` stays the user's)."""
    files = distribution.files or ()
    return any(str(f).endswith(".pth") or "__editable__" in str(f) for f in files)


def is_relax_file(file: str) -> bool:
    return not file.startswith("<") and Path(file).resolve().is_relative_to(_RELAX_DIR)


def is_user_file(file: str) -> bool:
    """Whether ``file`` is the user's code: a real file outside relax, the standard library and the
    installed packages (``<frozen ...>``, ``<string>`` are not files)."""
    if file.startswith("<") or "site-packages" in file or "dist-packages" in file:
        return False
    path = Path(file).resolve()
    return not any(path.is_relative_to(d) for d in _library_dirs())


def full_traceback(exc: BaseException) -> str:
    """Every traceback the failure carries: the driver's chain and, inside it, each worker's
    formatted traceback (part of a ``RayTaskError``'s text)."""
    return "".join(traceback.format_exception(exc))


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(\(\w+\))?(: .*)?$")
_RAY_TASK = re.compile(r"ray::(?P<task>[\w.]+)\(\).*?\(pid=(?P<pid>\d+)")


@attrs.frozen
class UserFailure:
    """Where the user's code failed: its frames (innermost last), the exception it raised and the
    Ray task that ran it (``RolloutWorker.rollout (pid 4242)``; None in the driver)."""

    frames: tuple[Frame, ...]
    exception: str
    worker: str | None


def find_user_failure(text: str) -> UserFailure | None:
    """The innermost failure of traceback ``text`` that went through the user's files: the block of
    the first user frame (Python prints a chain from its root cause), up to its exception line."""
    return _find_failure(text, is_user_file)


def find_relax_failure(text: str) -> UserFailure | None:
    """Where relax itself raised: the relax frames of the first (root-cause) block of ``text`` that
    went through relax, in the process that raised it (not the driver's wait for a worker)."""
    return _find_failure(text, is_relax_file)


def _find_failure(text: str, wanted) -> UserFailure | None:
    lines = [_ANSI.sub("", line) for line in text.splitlines()]
    frames: list[Frame] = []
    worker = None
    for i, line in enumerate(lines):
        task = _RAY_TASK.search(line)
        if task:  # a worker's own frames follow (Ray's header of the traceback it relays)
            worker, frames = f"{task['task']} (pid {task['pid']})", []
            continue
        if line.startswith("Traceback (most recent call last)"):
            worker, frames = None, []  # a block of the driver's own chain
            continue
        match = _FRAME.match(line)
        if match and wanted(match["file"]):
            following = lines[i + 1] if i + 1 < len(lines) else ""
            source = "" if _FRAME.match(following) else following.strip()
            frames.append(Frame(match["file"], int(match["line"]), match["func"], source))
        elif frames and line and not line[0].isspace() and _EXCEPTION_LINE.match(line):
            return UserFailure(tuple(frames), line.removeprefix("ray.exceptions."), worker)
    return UserFailure(tuple(frames), "", worker) if frames else None


def write_traceback(out: Path, text: str, step: int | None) -> Path | None:
    """Write the full traceback to ``<out>/error.log``; returns its path (None when it cannot)."""
    path = Path(out) / TRACEBACK_NAME
    where = f"at step {step}" if step is not None else "before the first step"
    try:
        path.write_text(f"relax run failed {where}; the full traceback, every process:\n\n{text}")
    except OSError:
        return None
    return path


def describe(text: str, step: int | None, traceback_path: Path | None) -> list[str] | None:
    """The few lines shown under ``relax train: error: ...``: the user's frames when the failure went
    through the user's code, else relax's own file:line where it was raised (None when the text holds
    no frame of either: relax's own message says enough)."""
    failure, whose = find_user_failure(text), "your code"
    if failure is None:
        failure, whose = find_relax_failure(text), "relax"
        if failure is not None and failure.worker is None and failure.exception.startswith("relax."):
            return None  # relax's own deliberate error in the driver: its message names the fix
    if failure is None:
        return None
    where = [f"at step {step}" if step is not None else "before the first step"]
    if failure.worker:
        where.append(f"in {failure.worker}")
    lines = [f"relax: {failure.exception or 'the error below'}, {' '.join(where)}, raised in {whose}:"]
    for frame in failure.frames[-SHOWN_FRAMES:]:
        lines += frame.lines()
    if traceback_path is not None:
        lines.append(f"relax: full traceback (every process): {traceback_path}")
    return lines


def report(exc: BaseException, out: Path, step: int | None) -> None:
    """Keep the full traceback of a failed run in ``<out>/error.log`` and, when it went through the
    user's code, attach the console lines (``describe``) to ``exc`` as ``relax_details``: ``relax
    train`` prints them above its one ``relax train: error:`` line."""
    text = full_traceback(exc)
    path = write_traceback(out, text, step)
    exc.relax_details = describe(text, step, path)
