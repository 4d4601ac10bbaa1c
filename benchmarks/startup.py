"""Start-up of ``relax train``: how long before step 1, phase by phase, cold and warm.

- **cold:** ``relax train --num-rollout 3`` as a user runs it (its own Ray, in a private temp dir);
- **warm:** the same with ``--ray-address`` on a cluster kept between runs (``ray start --head``,
  started once here in its own temp dir and stopped at the end by killing exactly its processes).
  The first run on the kept cluster starts its TransferQueue (kept up afterwards); the later ones
  attach to it and to Serve's controller.

Each run's own ``relax: start-up ...`` line is parsed: the total (from ``run()`` to step 1) and the
phases (seconds since the runtime's start-up began at which each part was ready: ``ray_s``,
``transferqueue_s``, ``serve_ready_s``, ``workers_ready_s``, and when each worker's ``__init__``
ended, e.g. ``rollout0_init_s``). The process's wall time and the load average are reported too: on a
shared machine read the numbers relative to each other (same invocation), not as absolutes.

    python benchmarks/startup.py [--cold 2] [--warm 3]
    python benchmarks/startup.py --smoke    # one cold run and one warm run, for the test suite

The last line of stdout is JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
STEPS = ["--num-rollout", "3", "--no-eval", "--no-progress"]
LINE = re.compile(r"relax: start-up ([0-9.]+)s \((.*)\)")


def _env(ray_tmp: str) -> dict:
    env = {**os.environ, "RAY_TMPDIR": ray_tmp, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled",
           "OMP_NUM_THREADS": "1", "TQ_NUM_THREADS": "2", "HF_HUB_OFFLINE": "1"}
    env.pop("RAY_ADDRESS", None)
    return env


def _train(cwd: Path, out: str, env: dict, *extra: str) -> dict:
    started = time.perf_counter()
    done = subprocess.run([str(BIN / "relax"), "train", *STEPS, *extra, "--output-dir", out], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - started
    match = LINE.search(done.stderr)
    if done.returncode != 0 or match is None:
        raise SystemExit(f"relax train failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    phases = {k: float(v) for k, v in (part.split() for part in match.group(2).split(", "))}
    return {"startup_s": float(match.group(1)), "phases": phases, "wall_s": round(wall, 2),
            "load_avg": os.getloadavg()[0]}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _processes_naming(text: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if text.encode() in f.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


def _start_head(temp_dir: str, env: dict) -> str:
    port = _free_port()
    ports = []
    for flag in ("--ray-client-server-port", "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
                 "--metrics-export-port", "--runtime-env-agent-port", "--node-manager-port", "--object-manager-port"):
        ports += [flag, str(_free_port())]
    subprocess.run([str(BIN / "ray"), "start", "--head", "--port", str(port), "--num-cpus", "6", "--temp-dir", temp_dir,
                    "--include-dashboard", "false", "--object-store-memory", str(256 * 2**20),
                    "--node-ip-address", "127.0.0.1", "--disable-usage-stats", *ports],
                   env=env, check=True, capture_output=True, text=True, timeout=300)
    return f"127.0.0.1:{port}"


def _stop_head(temp_dir: str) -> None:
    """Kill the kept cluster's processes (those naming its temp dir, and theirs): `ray stop` would stop
    every Ray cluster on the machine."""
    from relax.runtime.reaper import descendants

    pids = set(_processes_naming(temp_dir))
    for pid in list(pids):
        pids |= set(descendants(pid, only_ray=False))
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        time.sleep(2)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--cold", type=int, default=2, help="cold runs (each starts its own Ray)")
    parser.add_argument("--warm", type=int, default=3, help="runs on one kept cluster (0: none)")
    parser.add_argument("--smoke", action="store_true", help="one cold and one warm run")
    args = parser.parse_args(argv)
    cold_n, warm_n = (1, 1) if args.smoke else (args.cold, args.warm)
    work = Path(tempfile.mkdtemp(prefix="relax_startup_"))
    ray_tmp = tempfile.mkdtemp(prefix="rs_", dir="/tmp")  # short: unix socket paths are limited
    result = {"cold": [], "warm": []}
    try:
        for i in range(cold_n):
            result["cold"].append(_train(work, f"cold{i}", _env(ray_tmp)))
            print(f"cold {i}: {json.dumps(result['cold'][-1])}", file=sys.stderr)
        if warm_n:
            head_tmp = tempfile.mkdtemp(prefix="rw_", dir="/tmp")
            env = _env(ray_tmp)
            try:
                address = _start_head(head_tmp, env)
                for i in range(warm_n):
                    result["warm"].append(_train(work, f"warm{i}", env, "--ray-address", address))
                    print(f"warm {i}: {json.dumps(result['warm'][-1])}", file=sys.stderr)
            finally:
                _stop_head(head_tmp)
                shutil.rmtree(head_tmp, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    for kind, runs in result.items():
        for i, run in enumerate(runs):
            phases = ", ".join(f"{k} {v:.1f}" for k, v in run["phases"].items())
            print(f"{kind} {i}: start-up {run['startup_s']:.1f}s, wall {run['wall_s']:.1f}s, load {run['load_avg']:.1f} "
                  f"({phases})")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
