"""``relax cluster up`` / ``down`` / ``status``: a Ray cluster kept between runs, with everything a
run would otherwise start itself already up.

``up`` runs ``ray start --head`` (its own temp dir, so ``down`` stops exactly this cluster and not
another Ray on the machine), then, as a short-lived driver, starts what outlives it as detached
actors: TransferQueue's controller and storage unit (``TransferQueueKeeper``), Serve's controller
and the built-in methods' shared advantages app (``relax.runtime.kept_advantages``), and the pool of
pre-started workers (``relax.runtime.worker_pool``). ``relax train --ray-address ADDRESS`` then
attaches to all of them and starts no process of its own (a user's method still gets its own Serve
replica; a critic, for PPO, its own worker).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from relax.runtime.environment import RAY_ENV_DEFAULTS, apply_environment_defaults

DEFAULT_DIR = "/tmp/relax_cluster"  # short: Ray's unix socket paths are limited in length
STATE_FILE = "relax_cluster.json"
DEFAULT_PORT = 6380  # not Ray's 6379, which a user's own `ray start` takes


class ClusterError(Exception):
    """A message for the user: the command line prints it and exits 1."""


def _state(temp_dir: str) -> dict | None:
    try:
        return json.loads((Path(temp_dir) / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None


def _answers(address: str, timeout: float = 2.0) -> bool:
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except (OSError, ValueError):
        return False
    return True


def _free_ports() -> list[str]:
    """A free port for each of Ray's fixed defaults, so that another Ray on the machine (a local
    ``ray.init``, a test session's cluster) does not make ``ray start`` fail."""
    args = []
    for flag in ("--ray-client-server-port", "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port",
                 "--metrics-export-port", "--runtime-env-agent-port", "--node-manager-port", "--object-manager-port"):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            args += [flag, str(s.getsockname()[1])]
    return args


def _ray_bin() -> str:
    return str(Path(sys.executable).parent / "ray")


def up(temp_dir: str = DEFAULT_DIR, *, num_cpus: int = 8, spares: int = 1, port: int = DEFAULT_PORT,
       node_ip: str = "127.0.0.1") -> dict:
    """Start the kept cluster (or report the one already up in ``temp_dir``)."""
    apply_environment_defaults()
    state = _state(temp_dir)
    if state and _answers(state["address"]):
        return {**state, "already_up": True}
    t0 = time.perf_counter()
    Path(temp_dir).mkdir(parents=True, exist_ok=True)
    address = f"{node_ip}:{port}"
    if _answers(address):
        raise ClusterError(f"something already listens at {address}; pick another --port")
    started = subprocess.run(
        [_ray_bin(), "start", "--head", "--port", str(port), "--num-cpus", str(num_cpus), "--temp-dir", temp_dir,
         "--include-dashboard", "false", "--node-ip-address", node_ip, "--disable-usage-stats", *_free_ports()],
        capture_output=True, text=True, timeout=300, check=False,
    )
    if started.returncode != 0:
        raise ClusterError(f"`ray start --head` failed (exit {started.returncode}):\n{started.stderr[-2000:]}")
    state = {"address": address, "temp_dir": temp_dir, "spares": spares}
    try:
        _start_kept_roles(address, spares)
    except Exception:
        down(temp_dir)
        raise
    state["startup_s"] = round(time.perf_counter() - t0, 1)
    (Path(temp_dir) / STATE_FILE).write_text(json.dumps(state))
    return state


def _start_kept_roles(address: str, spares: int) -> None:
    import logging

    import ray

    from relax.runtime import lazy_dynamo
    from relax.runtime.data_plane import TransferQueueDataPlane
    from relax.runtime.ray_session import WORKER_CPUS
    from relax.runtime.worker_pool import start_pool

    env = {k: os.environ.get(k, v) for k, v in RAY_ENV_DEFAULTS.items()}
    ray.init(address=address, logging_level="WARNING", log_to_driver=False,
             runtime_env={"env_vars": env, "worker_process_setup_hook": lazy_dynamo.HOOK})
    try:
        TransferQueueDataPlane().start(keep=True).close()  # the keeper owns it; this driver only attached
        from ray import serve

        logging.getLogger("ray.serve").setLevel(logging.WARNING)
        quiet = {"enable_access_log": False, "log_level": "WARNING"}
        serve.start(proxy_location="Disabled", logging_config=quiet)
        if spares:
            from relax.runtime import kept_advantages

            kept_advantages.deploy(quiet)  # the built-in methods' shared advantages app
            start_pool(spares, WORKER_CPUS)
    finally:
        ray.shutdown()


def _processes_naming(texts: list[str]) -> list[int]:
    found = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmdline = f.read()
            except OSError:
                continue
            if any(t.encode() in cmdline for t in texts):
                found.append(int(entry))
    return found


def stop_processes(temp_dirs: list[str]) -> int:
    """SIGTERM, then SIGKILL, for the processes of the Ray nodes started in ``temp_dirs``: those
    naming one of them, and theirs (``ray stop`` would stop every Ray cluster on the machine).
    Returns how many processes were stopped."""
    from relax.runtime.reaper import descendants

    pids = set(_processes_naming(temp_dirs))
    for pid in list(pids):
        pids |= set(descendants(pid, only_ray=False))
    pids.discard(os.getpid())
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + 3
        while sig == signal.SIGTERM and time.monotonic() < deadline and any(_exists(p) for p in pids):
            time.sleep(0.1)
    return len(pids)


def down(temp_dir: str = DEFAULT_DIR) -> int:
    """Stop the cluster of ``temp_dir`` (``stop_processes``) and remove its temp dir; returns how
    many processes were stopped."""
    stopped = stop_processes([temp_dir])
    shutil.rmtree(temp_dir, ignore_errors=True)
    return stopped


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def status(temp_dir: str = DEFAULT_DIR) -> dict | None:
    """The state of the cluster of ``temp_dir`` when it answers, else None."""
    state = _state(temp_dir)
    return state if state and _answers(state["address"]) else None
