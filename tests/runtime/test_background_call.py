"""``relax.runtime.session.waits.BackgroundCall``: driver work off the critical path (dropping a finished
step from the data plane) that can neither hide an error, nor block the driver on a dead
TransferQueue component, nor keep ``relax train`` from exiting when its call hangs."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from relax.runtime.session import waits


def test_calls_run_one_after_another_and_an_error_surfaces_at_the_next_wait():
    order = []
    call = waits.BackgroundCall("testing")
    call.submit(lambda: (time.sleep(0.2), order.append("first")))
    call.submit(order.append, "second")  # waits for the first
    call.wait()
    assert order == ["first", "second"]
    call.submit(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        call.wait()
    call.wait()  # reported once


def test_waiting_on_a_hung_call_stops_when_a_watched_component_died(monkeypatch):
    monkeypatch.setattr(waits, "LIVENESS_POLL_S", 0.05)
    deaths = iter([None, "TransferQueue controller (actor TransferQueueController)"])
    monkeypatch.setattr(waits, "dead_component", lambda: next(deaths))
    release = threading.Event()
    call = waits.BackgroundCall("clearing a finished step from the data plane")
    call.submit(release.wait)
    try:
        with pytest.raises(waits.WorkerDied, match=r"the TransferQueue controller \(actor TransferQueueController\) "
                           r"died while clearing a finished step from the data plane"):
            call.wait()
    finally:
        release.set()


@pytest.mark.timeout(60)
def test_a_hung_call_does_not_keep_the_process_from_exiting():
    # A thread pool's worker would be joined at exit and hang the process forever.
    code = ("import threading\nfrom relax.runtime.session.waits import BackgroundCall\n"
            "BackgroundCall('hanging').submit(threading.Event().wait)\nprint('done')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and out.stdout.strip() == "done", out.stderr
