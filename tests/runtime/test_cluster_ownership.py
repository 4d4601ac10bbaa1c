"""``relax cluster down|up|status`` touch only the cluster's own processes, without Ray.

A stand-in cluster: a process started as the leader of a new session (as ``relax cluster up`` starts
``ray start``), which starts a member of the session and a child that leaves it with ``setsid`` (as a
worker's user code may); the state file records them as ``up`` would. Around it: a process that only
names the temp dir, one that names a sibling dir sharing its prefix, and the shell that calls ``down``
with the temp dir in its own command line.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from relax.runtime.cluster import kept_cluster
from relax.runtime.session import cluster_session

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="cluster ownership is read from /proc (Linux)")

ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
LEADER = """
import os, subprocess, sys, time
member = subprocess.Popen(["sleep", sys.argv[1]])
if os.fork() == 0:
    os.setsid()
    os.execvp("sleep", ["sleep", sys.argv[2]])
print("ready", flush=True)
time.sleep(600)
"""


def _mark() -> str:
    return f"{50000 + uuid.uuid4().int % 40000}.{uuid.uuid4().int % 10**9:09d}"


def _alive(proc: subprocess.Popen) -> bool:
    return proc.poll() is None


def _sleepers(mark: str) -> list[int]:
    found = []
    for pid in cluster_session.table():
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[:2] == [b"sleep", mark.encode()]:
            found.append(pid)
    return found


def _relax(*args: str, shell_prefix: str = "") -> subprocess.CompletedProcess:
    command = " ".join([sys.executable, "-m", "relax", *args])
    return subprocess.run(["bash", "-c", f"{shell_prefix}{command}; echo shell-still-here"], env=ENV,
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture
def bystanders():
    temp_dir = tempfile.mkdtemp(prefix="rco_", dir="/tmp")
    sleeper = "import time; time.sleep(120)"
    naming = subprocess.Popen([sys.executable, "-c", sleeper, temp_dir])
    sibling = subprocess.Popen([sys.executable, "-c", sleeper, temp_dir + "2"])
    try:
        yield temp_dir, naming, sibling
    finally:
        for proc in (naming, sibling):
            proc.kill()
            proc.wait()
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_down_stops_the_recorded_session_and_its_runaways_and_nothing_else(bystanders):
    temp_dir, naming, sibling = bystanders
    member_mark, runaway_mark = _mark(), _mark()
    leader = subprocess.Popen([sys.executable, "-c", LEADER, member_mark, runaway_mark], start_new_session=True,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert leader.stdout.readline().strip() == "ready"
        time.sleep(0.2)  # the runaway has exec'd `sleep`
        assert len(_sleepers(member_mark)) == 1 and len(_sleepers(runaway_mark)) == 1
        anchors = {str(p): s for p, s in cluster_session.members(leader.pid).items()}
        state = {"address": "127.0.0.1:1", "temp_dir": temp_dir, "spares": 0, "session": leader.pid,
                 "anchors": anchors}
        Path(temp_dir, kept_cluster.STATE_FILE).write_text(json.dumps(state))

        # The calling shell names the temp dir in its own command line (`bash -c "...D...; echo"`).
        down = _relax("cluster", "down", "--temp-dir", temp_dir)
        assert down.stdout.strip() == "shell-still-here", down.stderr
        assert "cluster down (3 process(es) stopped)" in down.stderr, down.stderr
        leader.wait(timeout=10)
        assert _sleepers(member_mark) == [] and _sleepers(runaway_mark) == []
        assert _alive(naming) and _alive(sibling)
        assert not Path(temp_dir).exists()
    finally:
        if _alive(leader):
            leader.kill()
        for pid in _sleepers(member_mark) + _sleepers(runaway_mark):
            os.kill(pid, 9)


def test_down_without_a_cluster_stops_nothing(bystanders):
    temp_dir, naming, sibling = bystanders
    down = _relax("cluster", "down", "--temp-dir", temp_dir)
    assert down.stdout.strip() == "shell-still-here"
    assert f"no cluster was running in {temp_dir}" in down.stderr, down.stderr
    assert _alive(naming) and _alive(sibling) and Path(temp_dir).exists()


@pytest.fixture
def stale_dir():
    temp_dir = tempfile.mkdtemp(prefix="rcs_", dir="/tmp")
    yield temp_dir
    shutil.rmtree(temp_dir, ignore_errors=True)


def test_a_stale_state_file_is_not_already_up_and_its_port_holder_is_named(stale_dir):
    temp_dir = stale_dir
    gone = subprocess.Popen(["true"], start_new_session=True)
    gone.wait()
    with socket.socket() as holder:  # another program now holds the port the state file names
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        state = {"address": f"127.0.0.1:{port}", "temp_dir": temp_dir, "spares": 1, "session": gone.pid,
                 "anchors": {str(gone.pid): 1}}
        Path(temp_dir, kept_cluster.STATE_FILE).write_text(json.dumps(state))
        assert kept_cluster.status(temp_dir) is None
        status = _relax("cluster", "status", "--temp-dir", temp_dir)
        assert "no cluster is up" in status.stderr, status.stderr
        up = _relax("cluster", "up", "--temp-dir", temp_dir, "--port", str(port))
        assert "already up" not in up.stderr
        assert f"relax cluster: error: something already listens at 127.0.0.1:{port}" in up.stderr, up.stderr


def test_path_matching_for_unrecorded_nodes_is_by_path_not_by_prefix():
    assert kept_cluster._names_dir(b"raylet\0--temp_dir=/tmp/rn_a\0", ["/tmp/rn_a"])
    assert kept_cluster._names_dir(b"x\0--session-dir=/tmp/rn_a/session_1\0", ["/tmp/rn_a/"])
    assert not kept_cluster._names_dir(b"raylet\0--temp_dir=/tmp/rn_ab\0", ["/tmp/rn_a"])
    assert not kept_cluster._names_dir(b"bash\0-c\0relax cluster down --temp-dir /tmp/rn_a; echo\0", ["/tmp/rn_a"])


HEAD_FIRST_LEADER = """
import subprocess, sys, time
head = subprocess.Popen([sys.argv[1], "600"])  # a stand-in GCS: Ray's binary name, `sleep`'s code
member = subprocess.Popen(["sleep", sys.argv[2]])
print(head.pid, member.pid, flush=True)
time.sleep(600)
"""
JOINED_RUN = """
import os, sys, time
log = open(os.path.join(sys.argv[1], "driver.log"), "w")  # as a joined driver holds its Ray log open
head, member = int(sys.argv[2]), int(sys.argv[3])
print("ready", flush=True)
while os.path.exists(f"/proc/{head}") and open(f"/proc/{head}/stat").read().split(")")[1].split()[0] != "Z":
    time.sleep(0.05)
time.sleep(0.5)  # a run's watch takes a moment to see the address refuse
print("member alive" if os.path.exists(f"/proc/{member}") else "member gone", flush=True)
"""


def test_down_stops_the_head_first_and_lets_a_joined_run_see_it_go(bystanders, tmp_path):
    # Ray ends a joined driver without a word once its raylet is gone; relax's watch of the GCS address
    # prints the line that names the cluster. So `down` stops the GCS, waits for the joined runs, then the rest.
    temp_dir, naming, sibling = bystanders
    gcs = tmp_path / "gcs_server"
    shutil.copy(shutil.which("sleep"), gcs)
    member_mark = _mark()
    leader = subprocess.Popen([sys.executable, "-c", HEAD_FIRST_LEADER, str(gcs), member_mark],
                              start_new_session=True, stdout=subprocess.PIPE, text=True)
    run = None
    try:
        head_pid, member_pid = leader.stdout.readline().split()
        anchors = {str(p): s for p, s in cluster_session.members(leader.pid).items()}
        Path(temp_dir, kept_cluster.STATE_FILE).write_text(json.dumps(
            {"address": "127.0.0.1:1", "temp_dir": temp_dir, "spares": 0, "session": leader.pid, "anchors": anchors}))
        run = subprocess.Popen([sys.executable, "-c", JOINED_RUN, temp_dir, head_pid, member_pid],
                               stdout=subprocess.PIPE, text=True)
        assert run.stdout.readline().strip() == "ready"

        down = _relax("cluster", "down", "--temp-dir", temp_dir)
        assert f"1 run(s) on the cluster (pid {run.pid}): stopping its head first and waiting for them to end" in down.stderr, down.stderr
        assert "cluster down (3 process(es) stopped)" in down.stderr, down.stderr
        assert run.stdout.readline().strip() == "member alive"  # the rest outlived the head
        assert run.wait(timeout=10) == 0  # the run is not the cluster's: it ended on its own
        assert _sleepers(member_mark) == [] and _alive(naming) and _alive(sibling)
    finally:
        for proc in (leader, run):
            if proc is not None and _alive(proc):
                proc.kill()
        for pid in _sleepers(member_mark):
            os.kill(pid, 9)
