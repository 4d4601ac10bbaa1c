"""The warm path end to end: ``relax cluster up`` keeps Ray, Serve, TransferQueue, the shared
advantages app and pre-started workers; ``relax train --ray-address`` runs on them, with a user's
reward module from its own directory, and gives the numbers a run that starts its own Ray gives;
the pool refills for the next run; ``relax cluster down`` stops exactly this cluster.

The cluster is this module's own (its own temp dir and port), like the two-node test's."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.multinode,  # starts its own cluster with `ray start`, like the two-node test
    pytest.mark.skipif(not os.path.isdir("/proc"), reason="`relax cluster down` stops processes through /proc (Linux)"),
]

BIN = Path(sys.executable).parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled",
       "TQ_NUM_THREADS": "2", "HF_HUB_OFFLINE": "1", "PATH": os.pathsep.join([str(BIN), os.environ.get("PATH", "")])}
ENV.pop("RAY_ADDRESS", None)
TINY = ["--num-rollout", "2", "--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--no-progress",
        "--no-eval", "--custom-rm-path", "relax_kept_reward:reward", "--reward-keys", "digits", "length"]
REWARD = textwrap.dedent('''
    def reward(prompt, completion, label, metadata):
        text = completion
        return {"digits": sum(c.isdigit() for c in text) / max(1, len(text)), "length": min(1.0, len(text) / 8)}
''')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _relax(*args: str, cwd: Path | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "relax"), *args], cwd=cwd, env=ENV, capture_output=True, text=True,
                          timeout=timeout, check=False)


def _numbers(run_dir: Path) -> list[dict]:
    """Every metric of every step but timings and throughputs (which no two runs share)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith(("time/", "perf/")) and not k.endswith("tokens_per_s")}
            for row in rows]


@pytest.fixture(scope="module")
def kept_cluster():
    temp_dir = tempfile.mkdtemp(prefix="rkc_", dir="/tmp")  # short: unix socket paths are limited
    up = _relax("cluster", "up", "--temp-dir", temp_dir, "--port", str(_free_port()), "--num-cpus", "6",
                "--spare-workers", "1")
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        yield up.stdout.strip(), temp_dir
    finally:
        _relax("cluster", "down", "--temp-dir", temp_dir, timeout=120)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_runs_on_pre_started_workers_give_the_numbers_of_a_run_with_its_own_ray(kept_cluster, tmp_path):
    address, temp_dir = kept_cluster
    assert _relax("cluster", "status", "--temp-dir", temp_dir).stdout.strip() == address
    (tmp_path / "relax_kept_reward.py").write_text(REWARD)

    first = _relax("train", "--ray-address", address, *TINY, "--output-dir", "warm1", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "relax: 2 pre-started worker(s) from the kept cluster's pool" in first.stderr, first.stderr[-3000:]
    second = _relax("train", "--ray-address", address, *TINY, "--output-dir", "warm2", cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "pre-started worker(s)" in second.stderr, "the pool did not refill after the first run"

    own = _relax("train", *TINY, "--output-dir", "cold", cwd=tmp_path)  # fresh workers, its own Ray
    assert own.returncode == 0, own.stderr[-3000:]
    assert "pre-started" not in own.stderr
    reference = _numbers(tmp_path / "cold")
    assert len(reference) >= 2 and any(row.get("reward/digits/std") for row in reference)
    assert _numbers(tmp_path / "warm1") == reference
    assert _numbers(tmp_path / "warm2") == reference


def test_cluster_down_stops_it_and_status_says_so(tmp_path):
    temp_dir = tempfile.mkdtemp(prefix="rkd_", dir="/tmp")
    missing = _relax("cluster", "status", "--temp-dir", temp_dir)
    assert missing.returncode == 1 and "no cluster is up" in missing.stderr
    down = _relax("cluster", "down", "--temp-dir", temp_dir)
    assert down.returncode == 0 and "no cluster was running" in down.stderr


def _wait_for_a_step(run: subprocess.Popen, metrics: Path, timeout: float = 400) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and run.poll() is None:
        if metrics.exists() and metrics.read_text().count("\n") >= 1:
            return
        time.sleep(1)
    raise AssertionError(f"the run on the kept cluster made no step (exit {run.poll()})")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_up_again_is_already_up_and_down_stops_every_process_of_its_session_and_only_those(kept_cluster, tmp_path):
    # Last in this module: it takes the module's cluster down (the fixture's own `down` then finds none),
    # while a run is training on it: that run ends with one line naming the cluster.
    from relax.runtime.cluster.kept_cluster import STATE_FILE
    from relax.runtime.session import cluster_session

    address, temp_dir = kept_cluster
    again = _relax("cluster", "up", "--temp-dir", temp_dir, "--port", address.rsplit(":", 1)[1])
    assert again.returncode == 0 and f"cluster already up at {address}" in again.stderr, again.stderr[-2000:]
    state = json.loads((Path(temp_dir) / STATE_FILE).read_text())
    before = cluster_session.members(state["session"])
    client_servers = [pid for pid in before if b"ray.util.client.server" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert client_servers, "Ray's client server is not in the cluster's session"
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", temp_dir, temp_dir + "2"])
    (tmp_path / "relax_kept_reward.py").write_text(REWARD)
    long_run = [*TINY[:1], "1000", *TINY[2:]]
    log = open(tmp_path / "gone.log", "w+")  # a file, not a pipe: nothing reads it while the run goes on
    run = subprocess.Popen([str(BIN / "relax"), "train", "--ray-address", address, *long_run, "--output-dir", "gone"],
                           cwd=tmp_path, env=ENV, stdout=subprocess.DEVNULL, stderr=log, text=True)
    try:
        _wait_for_a_step(run, tmp_path / "gone" / "metrics.jsonl")
        down = subprocess.run(["bash", "-c", f"{BIN / 'relax'} cluster down --temp-dir {temp_dir}; echo shell-alive"],
                              env=ENV, capture_output=True, text=True, timeout=120, check=False)
        assert down.stdout.strip() == "shell-alive", down.stderr[-2000:]
        assert "cluster down (" in down.stderr
        assert cluster_session.members(state["session"]) == {}  # client server, raylet, GCS, workers: all
        assert bystander.poll() is None
        run.wait(timeout=120)
        stderr = (tmp_path / "gone.log").read_text()
        errors = [line for line in stderr.splitlines() if line.startswith("relax train: error:")]
        assert run.returncode == 1 and len(errors) == 1, stderr[-3000:]
        assert f"the Ray cluster at {address} (--ray-address) went away mid-run" in errors[0]
    finally:
        for proc in (bystander, run):
            proc.kill()
            proc.wait()
        log.close()
