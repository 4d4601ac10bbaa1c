"""What relax prints while it runs: one line at a time on stderr (stdout carries only what a
command means to output, e.g. JSON a script reads)."""

from __future__ import annotations

import sys


def log(msg: str, bar=None) -> None:
    """A line on stderr (through the progress bar when one is shown, so it is not garbled)."""
    if bar is not None:
        bar.write(msg, file=sys.stderr)
    else:
        print(msg, file=sys.stderr, flush=True)
