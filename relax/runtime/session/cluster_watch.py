"""A run on a cluster it joined (``--ray-address``) ends with one line when that cluster goes away.

Ray's own reaction to a head node that disappears mid-run (``relax cluster down`` in another shell, a
crash) is a minute of C++ reconnection errors and then an abrupt exit of the driver, with nothing
that says what happened. So the driver watches the address it joined: a daemon thread connects to it
every ``INTERVAL_S``; when the connection is refused ``REFUSED_TIMES`` times in a row (nothing
listens there any more) or fails otherwise for ``UNREACHABLE_S`` (a machine that went away), it
prints one ``relax train: error:`` line naming the address and the flag, and ends the process (exit
1): there is nothing left to shut down in a cluster that is gone, and waiting gains nothing.
"""

from __future__ import annotations

import errno
import os
import socket
import sys
import threading
import time
from collections.abc import Callable

INTERVAL_S = 0.5
REFUSED_TIMES = 3
UNREACHABLE_S = 30.0
EXIT_CODE = 1


def host_port(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of ``[scheme://]host:port``; None for ``auto`` and other forms Ray resolves."""
    target = address.split("://", 1)[-1].rstrip("/")
    host, _, port = target.rpartition(":")
    return (host.strip("[]"), int(port)) if host and port.isdigit() else None


def gone_message(address: str, how: str) -> str:
    return (f"relax train: error: the Ray cluster at {address} (--ray-address) went away mid-run ({how}): "
            "was it taken down (`relax cluster down`) or did its head node stop? Start it again "
            "(`relax cluster up`) and rerun; nothing of this run is left on it")


def _end_process(message: str) -> None:
    sys.stdout.flush()
    print(message, file=sys.stderr, flush=True)
    os._exit(EXIT_CODE)


class ClusterWatch:
    """Watches ``address`` until ``stop()``; calls ``on_gone(message)`` once when it is gone."""

    def __init__(self, address: str, on_gone: Callable[[str], None] = _end_process,
                 interval_s: float = INTERVAL_S, refused_times: int = REFUSED_TIMES,
                 unreachable_s: float = UNREACHABLE_S):
        self.address, self.on_gone = address, on_gone
        self.interval_s, self.refused_times, self.unreachable_s = interval_s, refused_times, unreachable_s
        self._target = host_port(address)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="relax-cluster-watch", daemon=True)

    def start(self) -> ClusterWatch:
        if self._target is not None:
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()

    def _probe(self) -> int:
        """0 when something accepts a connection at the address, else the errno of the failure."""
        try:
            socket.create_connection(self._target, timeout=max(1.0, self.interval_s)).close()
        except OSError as exc:
            return exc.errno or errno.ETIMEDOUT
        return 0

    def _watch(self) -> None:
        refused, failing_since = 0, None
        while not self._stopped.wait(self.interval_s):
            err = self._probe()
            if self._stopped.is_set():
                return
            if err == 0:
                refused, failing_since = 0, None
                continue
            failing_since = failing_since or time.monotonic()
            refused = refused + 1 if err == errno.ECONNREFUSED else 0
            if refused >= self.refused_times:
                how = f"nothing listens there any more: connection refused {refused} times in a row"
            elif time.monotonic() - failing_since >= self.unreachable_s:
                how = f"unreachable for {self.unreachable_s:g}s: {os.strerror(err)}"
            else:
                continue
            self.on_gone(gone_message(self.address, how))
            return
