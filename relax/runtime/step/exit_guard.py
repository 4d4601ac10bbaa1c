"""User code that ends its process with ``os._exit()`` is named before the process goes.

``sys.exit()`` in a reward function, hook or environment is an exception and is reported as such where
it is caught; ``os._exit()`` cannot be caught: the rollout worker (or, with ``--in-process``, relax
itself) just disappears, and the driver can only say that the worker died. So the rollout's process
replaces ``os._exit`` with a wrapper that, when the caller is the user's code (a file neither of relax
nor of an installed package or the standard library), first writes one line naming the call's file,
line and function to stderr (Ray relays a worker's stderr to the driver), then exits exactly as asked.
Calls from Ray, relax or any library pass through silently.
"""

from __future__ import annotations

import os
import sys
import sysconfig

import relax

# Installed code is not the user's: the standard library, site-packages, and the environment's
# console scripts (a `pytest` or `relax` entry script is the outermost frame of its process).
LIBRARY_DIRS = tuple(
    {os.path.realpath(p) + os.sep for k, p in sysconfig.get_paths().items()
     if k in ("stdlib", "platstdlib", "purelib", "platlib", "scripts")}
)
RELAX_DIR = os.path.dirname(os.path.realpath(relax.__file__)) + os.sep  # the relax package's own files


def is_library(filename: str) -> bool:
    path = os.path.realpath(filename)
    return not path.startswith(RELAX_DIR) and (path.startswith(LIBRARY_DIRS) or filename.startswith("<"))


def _user_place(frame) -> str | None:
    filename = frame.f_code.co_filename
    if is_library(filename) or os.path.realpath(filename).startswith(RELAX_DIR):
        return None
    return f"{filename}:{frame.f_lineno} in {frame.f_code.co_qualname}"


def guard_os_exit(process: str = "rollout worker") -> None:
    """Install the wrapper (once per process)."""
    if getattr(os._exit, "relax_guard", False):
        return
    original = os._exit

    def _exit(status):
        where = _user_place(sys._getframe(1))
        if where is not None:
            line = (f"relax: user code called os._exit({status}) at {where}: it ends the {process}'s process at "
                    "once (nothing can catch it); raise an exception instead\n")
            try:
                os.write(2, line.encode(errors="replace"))
            except OSError:
                pass
        original(status)

    _exit.relax_guard = True
    os._exit = _exit
