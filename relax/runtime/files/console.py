"""What relax prints while it runs: one line at a time on stderr (stdout carries only what a
command means to output, e.g. JSON a script reads).

Printing must never cost the user a model: when the reader of stdout or stderr is gone (``| tee``
killed by the same Ctrl-C, ``| head`` done reading, a closed terminal), writing raises
``BrokenPipeError`` / ``EIO``. ``guarded_output()`` makes such a stream silently discard what is
written from then on, so that the run still finishes its steps, saves and exits with its own code.
"""

from __future__ import annotations

import contextlib
import os
import sys


class GuardedStream:
    """A text stream that turns a failed write into nothing: after the first error it points its
    file descriptor at ``/dev/null`` (so writers holding the raw stream — tqdm, Ray's output relay,
    logging handlers, the interpreter's flush at exit — stop failing too) and drops what follows."""

    def __init__(self, stream):
        self._stream = stream
        self.broken = False

    def write(self, text):
        if not self.broken:
            try:
                return self._stream.write(text)
            except (OSError, ValueError):  # EPIPE, EIO, or a stream closed under us
                self._detach()
        return len(text)

    def flush(self):
        if not self.broken:
            try:
                self._stream.flush()
            except (OSError, ValueError):
                self._detach()

    def _detach(self) -> None:
        self.broken = True
        with contextlib.suppress(Exception):
            fd = self._stream.fileno()
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, fd)
            os.close(devnull)
            with contextlib.suppress(Exception):  # the unwritable bytes still buffered go to /dev/null
                self._stream.flush()

    def isatty(self):
        return not self.broken and self._stream.isatty()

    def __getattr__(self, name):  # encoding, fileno, buffer, ...
        return getattr(self._stream, name)


@contextlib.contextmanager
def guarded_output():
    """Guard ``sys.stdout`` and ``sys.stderr`` (``GuardedStream``) while the block runs."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = (s if isinstance(s, GuardedStream) else GuardedStream(s) for s in saved)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


def log(msg: str, bar=None) -> None:
    """A line on stderr (through the progress bar when one is shown, so it is not garbled). A reader
    that is gone never makes this raise (see the module docstring)."""
    try:
        if bar is not None:
            bar.write(msg, file=sys.stderr)
        else:
            print(msg, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass
