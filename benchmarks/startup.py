"""Start-up of ``relax train``: how long before step 1, phase by phase, cold and warm.

- **cold:** ``relax train --num-rollout 3`` as a user runs it (its own Ray, in a private temp dir);
- **warm:** the same with ``--ray-address`` on a kept cluster (``relax cluster up`` in its own temp
  dir, ``relax cluster down`` at the end): Ray, Serve's controller, TransferQueue, the shared
  advantages app and ``--spare-workers`` pre-started workers of each kind are up before the first
  run; each run takes pre-started workers, and the pool boots replacements after it (``--pause``
  between runs leaves them the time to);
- **in_process:** ``relax train --num-rollout 3 --in-process``: the one rollout worker and the one
  actor rank in the driver's process, without Ray, TransferQueue or Serve (its phases are the
  workers' construction, ``rollout0_init_s``, ``actor0_init_s``, ``workers_ready_s``).

Each run's own ``relax: start-up ...`` line is parsed: the total (from ``run()`` to step 1) and the
phases (seconds since the runtime's start-up began at which each part was ready: ``ray_s``,
``transferqueue_s``, ``serve_ready_s``, ``workers_ready_s``, and when each worker's ``__init__``
ended, e.g. ``rollout0_init_s``). The process's wall time and the load average are reported too: on a
shared machine read the numbers relative to each other (same invocation), not as absolutes.

    python benchmarks/startup.py [--cold 2] [--warm 3] [--in-process 2] [--spare-workers 1] [--pause 10]
    python benchmarks/startup.py --smoke    # one cold, one warm and one in-process run, for the test suite

The last line of stdout is JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
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
                          capture_output=True, text=True, timeout=900, check=False)
    wall = time.perf_counter() - started
    match = LINE.search(done.stderr)
    if done.returncode != 0 or match is None:
        raise SystemExit(f"relax train failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    phases = {k: float(v) for k, v in (part.split() for part in match.group(2).split(", "))}
    return {"startup_s": float(match.group(1)), "phases": phases, "wall_s": round(wall, 2),
            "load_avg": os.getloadavg()[0], "pre_started_workers": "pre-started worker(s)" in done.stderr}


def _relax_cluster(*args: str, env: dict) -> str:
    done = subprocess.run([str(BIN / "relax"), "cluster", *args], env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    if done.returncode != 0:
        raise SystemExit(f"relax cluster {args[0]} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout.strip()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--cold", type=int, default=2, help="cold runs (each starts its own Ray)")
    parser.add_argument("--warm", type=int, default=3, help="runs on one kept cluster (0: none)")
    parser.add_argument("--spare-workers", type=int, default=1,
                        help="the kept cluster's pre-started workers of each kind (0: Ray, Serve and TQ kept only)")
    parser.add_argument("--pause", type=float, default=10.0,
                        help="seconds between warm runs (the pool boots the next run's workers meanwhile)")
    parser.add_argument("--in-process", type=int, default=2, help="runs with relax train --in-process (no Ray)")
    parser.add_argument("--smoke", action="store_true", help="one cold, one warm and one in-process run")
    args = parser.parse_args(argv)
    cold_n, warm_n, local_n = (1, 1, 1) if args.smoke else (args.cold, args.warm, args.in_process)
    work = Path(tempfile.mkdtemp(prefix="relax_startup_"))
    ray_tmp = tempfile.mkdtemp(prefix="rs_", dir="/tmp")  # short: unix socket paths are limited
    result = {"cold": [], "warm": [], "in_process": []}
    try:
        for i in range(local_n):
            result["in_process"].append(_train(work, f"local{i}", _env(ray_tmp), "--in-process"))
            print(f"in_process {i}: {json.dumps(result['in_process'][-1])}", file=sys.stderr)
        for i in range(cold_n):
            result["cold"].append(_train(work, f"cold{i}", _env(ray_tmp)))
            print(f"cold {i}: {json.dumps(result['cold'][-1])}", file=sys.stderr)
        if warm_n:
            head_tmp = tempfile.mkdtemp(prefix="rw_", dir="/tmp")
            env = _env(ray_tmp)
            try:
                address = _relax_cluster("up", "--temp-dir", head_tmp, "--port", str(_free_port()),
                                         "--spare-workers", str(args.spare_workers), env=env)
                for i in range(warm_n):
                    if i:
                        time.sleep(args.pause)  # the pool's replacements boot after each run
                    result["warm"].append(_train(work, f"warm{i}", env, "--ray-address", address))
                    print(f"warm {i}: {json.dumps(result['warm'][-1])}", file=sys.stderr)
            finally:
                _relax_cluster("down", "--temp-dir", head_tmp, env=env)
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
