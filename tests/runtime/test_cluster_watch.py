"""A run on a joined cluster (``--ray-address``) that goes away ends with one line naming it.

The end to end case (``relax cluster down`` during ``relax train --ray-address``) is in
test_kept_cluster.py; these check the watch itself on a plain socket, without Ray."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from relax.runtime.session.cluster_watch import ClusterWatch, host_port

ROOT = Path(__file__).resolve().parents[2]


def _listener() -> socket.socket:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    return server


def test_a_listener_that_closes_is_reported_once_naming_address_and_flag():
    server = _listener()
    address = f"127.0.0.1:{server.getsockname()[1]}"
    reports, fired = [], threading.Event()
    watch = ClusterWatch(address, on_gone=lambda m: (reports.append(m), fired.set()), interval_s=0.1).start()
    time.sleep(0.5)
    assert reports == []  # it answers: nothing to say
    server.close()
    assert fired.wait(5)
    time.sleep(0.3)
    watch.stop()
    assert len(reports) == 1
    assert reports[0].startswith(f"relax train: error: the Ray cluster at {address} (--ray-address) went away")
    assert "connection refused 3 times" in reports[0]


def test_a_stopped_watch_says_nothing_and_other_addresses_are_left_to_ray():
    server = _listener()
    reports = []
    watch = ClusterWatch(f"127.0.0.1:{server.getsockname()[1]}", on_gone=reports.append, interval_s=0.1).start()
    watch.stop()
    server.close()
    time.sleep(0.6)
    assert reports == []
    assert host_port("auto") is None and host_port("ray://head:10001") == ("head", 10001)


def test_the_default_ends_the_process_with_one_error_line_and_exit_1():
    server = _listener()
    port = server.getsockname()[1]
    script = ("import time\nfrom relax.runtime.session.cluster_watch import ClusterWatch\n"
              f"ClusterWatch('127.0.0.1:{port}', interval_s=0.1).start()\nprint('running', flush=True)\n"
              "time.sleep(30)\nprint('not reached')")
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={"PYTHONPATH": str(ROOT)})
    assert proc.stdout.readline().strip() == "running"
    start = time.monotonic()
    server.close()
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 1 and time.monotonic() - start < 10
    assert out == "" and err.count("\n") == 1 and err.startswith("relax train: error: the Ray cluster at")
