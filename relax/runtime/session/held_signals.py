"""Hold Ctrl-C, SIGTERM and SIGHUP for a few statements that must not be cut in half.

Python runs a signal's handler between two bytecodes of the main thread, so a ``KeyboardInterrupt``
can land between any two statements: between taking a step's metrics row out of the pipeline and
writing it to ``metrics.jsonl``, or half-way through a local call's results. ``signals_held()``
swaps the Python handlers for one that notes the signal, and calls the original handler with the
first noted signal when the block ends, so the block runs whole and the interrupt comes right after.
"""

from __future__ import annotations

import contextlib
import signal
import threading

HELD = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def signals_held():
    """The signals in ``HELD`` that arrive during the block are delivered when it ends. Only Python
    handlers are swapped (the default SIGINT one raises ``KeyboardInterrupt``; ``relax train``'s SIGTERM
    and SIGHUP ones raise its subclass); an ignored or default-action signal is left as it is. Outside
    the main thread, where Python never runs handlers, the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held, previous = [], {}
    for sig in HELD:
        handler = signal.getsignal(sig)
        if callable(handler):
            previous[sig] = handler
            signal.signal(sig, lambda signum, frame: held.append((signum, frame)))
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for signum, frame in held[:1]:  # a second signal during the block asks for the same thing
            previous[signum](signum, frame)
