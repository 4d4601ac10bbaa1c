"""Two nodes for real (issue 25, item 8): a Ray cluster of a head and a worker node, each started by
``ray start`` in its own process with its own temp dir and resources, on this machine; ``relax
train --ray-address`` runs with workers on both nodes, ships only the user's module (a large file
next to it stays behind), and a second run on the same kept cluster starts faster (the warm path).
Disk use of the cluster is checked.

The cluster is this module's own (not the session's shared one: the point is two raylets and a
driver that joins them), and it is stopped by killing exactly its processes (found by its temp
dirs): ``ray stop`` would stop every Ray cluster on the machine.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from relax.runtime.cluster.kept_cluster import stop_processes

pytestmark = [
    pytest.mark.multinode,
    pytest.mark.skipif(not os.path.isdir("/proc"), reason="stops the cluster's processes through /proc (Linux)"),
]

BIN = Path(sys.executable).parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled",
       "TQ_NUM_THREADS": "2", "HF_HUB_OFFLINE": "1",
       "PATH": os.pathsep.join([str(BIN), os.environ.get("PATH", "")])}
ENV.pop("RAY_ADDRESS", None)
# relax's single-machine default (bind to loopback) makes `ray start --address` refuse to add a node
# ("Multi-node Ray clusters are not supported"): the nodes bind to 127.0.0.1 through --node-ip-address.
ENV.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
DISK_LIMIT_MB = 1024  # both nodes' temp dirs together, after two runs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node_args(temp_dir: str, resource: str) -> list[str]:
    """Every port a node would otherwise take at a fixed default is a free one (other clusters may
    be running on this machine), and a small object store."""
    args = ["--num-cpus", "3", "--temp-dir", temp_dir, "--node-ip-address", "127.0.0.1",
            "--object-store-memory", str(100 * 2**20), "--resources", json.dumps({resource: 1}),
            "--disable-usage-stats"]
    for flag in ("--dashboard-agent-listen-port", "--dashboard-agent-grpc-port", "--metrics-export-port",
                 "--runtime-env-agent-port", "--node-manager-port", "--object-manager-port"):
        args += [flag, str(_free_port())]
    return args


def _disk_mb(path: str) -> float:
    total = 0
    for dirpath, _, filenames in os.walk(path):
        for name in filenames:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except OSError:
                pass
    return total / 2**20


START_TRIES = 5  # `ray start` gives a raylet a fixed 30 s to register: a busy machine can miss it


def _start_node(argv: list[str], prefix: str, temp_dirs: list[str]) -> None:
    """``ray start ...`` in a fresh temp dir (appended to ``temp_dirs``), tried again when it fails."""
    for attempt in range(START_TRIES):
        temp_dir = tempfile.mkdtemp(prefix=prefix, dir="/tmp")  # short: unix socket paths are limited
        temp_dirs.append(temp_dir)
        done = subprocess.run([str(BIN / "ray"), "start", *argv, *_node_args(temp_dir, prefix.strip("_"))],
                              env=ENV, capture_output=True, text=True, timeout=240)
        if done.returncode == 0:
            return
        stop_processes([temp_dir])  # what the failed start left
        temp_dirs.remove(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)
        if attempt == START_TRIES - 1:
            pytest.fail(f"ray start {' '.join(argv[:2])} failed {START_TRIES} times: {done.stderr[-2000:]}")


@pytest.fixture(scope="module")
def two_nodes():
    temp_dirs: list[str] = []
    port = _free_port()
    try:
        _start_node(["--head", "--port", str(port), "--include-dashboard", "false", "--ray-client-server-port",
                     str(_free_port())], "rn_head_", temp_dirs)
        _start_node(["--address", f"127.0.0.1:{port}"], "rn_work_", temp_dirs)
        yield f"127.0.0.1:{port}", list(temp_dirs)
    finally:
        stop_processes(temp_dirs)
        for temp_dir in temp_dirs:
            shutil.rmtree(temp_dir, ignore_errors=True)


JUDGE = textwrap.dedent(
    """
    def judge(prompt, completion, label, metadata):
        # varies within a prompt group (a group of equal rewards is dropped, and a run that trains
        # nothing fails), whatever the model writes
        return len(completion) / 8 + 0.1 * completion.count("1")
    """
)
TINY = ["--num-rollout", "2", "--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--no-progress",
        "--no-eval", "--custom-rm-path", "relax_two_node_judge:judge", "--reward-keys", "reward"]


def _train(address: str, cwd: Path, out: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "relax"), "train", "--ray-address", address, *TINY, "--output-dir", out],
                          cwd=cwd, env=ENV, capture_output=True, text=True, timeout=600)


def _startup_s(stderr: str) -> float:
    return float(re.search(r"relax: start-up ([0-9.]+)s", stderr).group(1))


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_relax_train_joins_two_nodes_ships_only_the_users_module_and_starts_warm(two_nodes, tmp_path):
    address, temp_dirs = two_nodes
    user = tmp_path / "user"
    user.mkdir()
    (user / "relax_two_node_judge.py").write_text(JUDGE)
    with open(user / "big_data_set.bin", "wb") as f:  # sparse: costs no disk here, 300 MiB if uploaded
        f.truncate(300 * 2**20)

    first = _train(address, user, "run1")
    assert first.returncode == 0, first.stderr[-3000:]
    assert "relax: 2 worker(s) on 2 node(s)" in first.stderr, first.stderr[-3000:]
    assert (user / "run1" / "checkpoints" / "step_000002" / "state.pt").exists()
    # the only package uploaded is the judge's file: nothing of the size of the data set
    packages = [p for d in temp_dirs for p in Path(d).rglob("*") if p.is_file() and "_ray_pkg_" in p.name]
    assert packages, "no runtime_env package found: the module was not shipped"
    assert all(p.stat().st_size < 2**20 for p in packages), [(p, p.stat().st_size) for p in packages]
    assert not any("big_data_set" in str(p) for d in temp_dirs for p in Path(d).rglob("*"))

    second = _train(address, user, "run2")  # the kept cluster: Ray is already up on both nodes
    assert second.returncode == 0, second.stderr[-3000:]
    assert "relax: 2 worker(s) on 2 node(s)" in second.stderr
    print(f"start-up: first run {_startup_s(first.stderr):.1f}s, second run {_startup_s(second.stderr):.1f}s")
    used = sum(_disk_mb(d) for d in temp_dirs)
    assert used < DISK_LIMIT_MB, f"the cluster's temp dirs hold {used:.0f} MiB"
