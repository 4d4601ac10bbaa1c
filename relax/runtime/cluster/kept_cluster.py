"""``relax cluster up`` / ``down`` / ``status``: a Ray cluster kept between runs, with everything a
run would otherwise start itself already up.

``up`` runs ``ray start --head`` in a session of its own (``relax.runtime.session.cluster_session``: the
state file records it, so ``down`` stops exactly this cluster's processes and nothing that merely
names its temp dir, nor another Ray on the machine), then, as a short-lived driver, starts what outlives it as detached
actors: TransferQueue's controller and storage unit (``TransferQueueKeeper``), Serve's controller
and the built-in methods' shared advantages app (``relax.runtime.cluster.kept_advantages``), and the pool of
pre-started workers (``relax.runtime.cluster.worker_pool``). ``relax train --ray-address ADDRESS`` then
attaches to all of them and starts no process of its own (a user's method still gets its own Serve
replica; a critic, for PPO, its own worker).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from relax.runtime.data.environment import RAY_ENV_DEFAULTS, apply_environment_defaults
from relax.runtime.session import cluster_session

DEFAULT_DIR = "/tmp/relax_cluster"  # short: Ray's unix socket paths are limited in length
STATE_FILE = "relax_cluster.json"
DEFAULT_PORT = 6380  # not Ray's 6379, which a user's own `ray start` takes
JOINED_GRACE_S = 10.0  # how long `down` waits for the runs on the cluster to see it go (a few s)


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


def _is_up(state: dict | None) -> bool:
    """Whether the state file names a cluster that is really there: a process recorded at its
    start-up still lives in its session, and its address answers. A stale file (the cluster died,
    the machine rebooted, another program now holds the port) is not."""
    return bool(state and "session" in state
                and cluster_session.anchors_alive(state["session"], state.get("anchors", {}))
                and _answers(state["address"]))


def _write_state(temp_dir: str, state: dict) -> None:
    (Path(temp_dir) / STATE_FILE).write_text(json.dumps(state))


def up(temp_dir: str = DEFAULT_DIR, *, num_cpus: int = 8, spares: int = 1, port: int = DEFAULT_PORT,
       node_ip: str = "127.0.0.1") -> dict:
    """Start the kept cluster (or report the one already up in ``temp_dir``)."""
    apply_environment_defaults()
    state = _state(temp_dir)
    if _is_up(state):
        return {**state, "already_up": True}
    if state is not None:  # stale: stop what is left of its session, forget it
        down(temp_dir)
    t0 = time.perf_counter()
    Path(temp_dir).mkdir(parents=True, exist_ok=True)
    address = f"{node_ip}:{port}"
    if _answers(address):
        raise ClusterError(f"something already listens at {address}; pick another --port")
    # Its own session: every process Ray starts for this cluster carries the session id (see
    # cluster_session), which is how `down` finds exactly them.
    starter = subprocess.Popen(
        [_ray_bin(), "start", "--head", "--port", str(port), "--num-cpus", str(num_cpus), "--temp-dir", temp_dir,
         "--include-dashboard", "false", "--node-ip-address", node_ip, "--disable-usage-stats", *_free_ports()],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    # Recorded at once, so that `down` finds what an interrupted start-up left (with no anchors yet,
    # only the session's Ray processes: cluster_session.owned), then with the processes as anchors.
    state = {"address": address, "temp_dir": temp_dir, "spares": spares, "session": starter.pid, "anchors": {}}
    _write_state(temp_dir, state)
    try:
        _, stderr = starter.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        starter.kill()
        _, stderr = starter.communicate()
    state["anchors"] = {str(pid): start for pid, start in cluster_session.members(starter.pid).items()}
    _write_state(temp_dir, state)
    if starter.returncode != 0:
        down(temp_dir)
        raise ClusterError(f"`ray start --head` failed (exit {starter.returncode}):\n{stderr[-2000:]}")
    try:
        _start_kept_roles(address, spares)
    except Exception:
        down(temp_dir)
        raise
    state["startup_s"] = round(time.perf_counter() - t0, 1)
    _write_state(temp_dir, state)
    return state


def _start_kept_roles(address: str, spares: int) -> None:
    import logging

    import ray

    from relax.runtime.cluster.worker_pool import start_pool
    from relax.runtime.data import lazy_dynamo
    from relax.runtime.data.data_plane import TransferQueueDataPlane
    from relax.runtime.session.ray_session import WORKER_CPUS

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
            from relax.runtime.cluster import kept_advantages

            kept_advantages.deploy(quiet)  # the built-in methods' shared advantages app
            start_pool(spares, WORKER_CPUS)
    finally:
        ray.shutdown()


def _names_dir(cmdline: bytes, temp_dirs: list[str]) -> bool:
    """Whether an argument is one of ``temp_dirs`` or a path inside it (``--flag=DIR/...`` too); a
    sibling directory sharing the prefix (``DIR2``) is not."""
    for arg in cmdline.split(b"\0"):
        value = arg.split(b"=", 1)[1] if arg.startswith(b"-") and b"=" in arg else arg
        for d in temp_dirs:
            d = d.rstrip("/").encode()
            if value == d or value.startswith(d + b"/"):
                return True
    return False


def stop_processes(temp_dirs: list[str]) -> int:
    """Stop Ray nodes started with ``ray start --temp-dir`` outside ``relax cluster up`` (no recorded
    session): the Ray processes with one of ``temp_dirs`` (or a path in it) as an argument, and their
    descendants; never this process or its ancestors. Returns how many processes were stopped."""
    from relax.runtime.session.reaper import descendants

    procs = cluster_session.table()
    chosen = {}
    for pid in procs:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if _names_dir(cmdline, temp_dirs) and cluster_session.is_ray(pid):
            chosen[pid] = procs[pid].start
            chosen.update(descendants(pid, only_ray=False))
    for pid in cluster_session.ancestors(os.getpid(), procs):
        chosen.pop(pid, None)
    return cluster_session.stop(chosen)


def _stop_head_first(temp_dir: str, owned: dict[int, int]) -> int:
    """Stop the GCS first, give the runs that joined the cluster up to ``JOINED_GRACE_S`` to end, then
    stop the rest. A joined run watches the GCS's address and ends with one line naming the cluster
    once nothing listens there (``relax.runtime.session.cluster_watch``); Ray itself ends such a driver
    without a word as soon as it finds its raylet gone, so the raylet must outlive the GCS by that long."""
    runs = cluster_session.joined(temp_dir, owned)
    if runs:
        print(f"relax: {len(runs)} run(s) on the cluster (pid {', '.join(map(str, sorted(runs)))}): "
              "stopping its head first and waiting for them to end", file=sys.stderr, flush=True)
    gcs = {pid: start for pid, start in owned.items() if _is_gcs(pid)}
    stopped = cluster_session.stop(gcs)
    cluster_session.wait_gone(runs, JOINED_GRACE_S)
    return stopped + cluster_session.stop({pid: start for pid, start in owned.items() if pid not in gcs})


def _is_gcs(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return os.path.basename(f.read().split(b"\0", 1)[0]) == b"gcs_server"
    except OSError:
        return False


def down(temp_dir: str = DEFAULT_DIR) -> int:
    """Stop the processes of the cluster of ``temp_dir`` (those of the session its state file records,
    ``cluster_session.owned``) and remove its temp dir; returns how many processes were stopped."""
    state = _state(temp_dir)
    stopped = 0
    if state and "session" in state:
        stopped = _stop_head_first(temp_dir, cluster_session.owned(state["session"], state.get("anchors", {})))
    elif state is not None:  # a state file of an older relax, without a session: its Ray processes
        stopped = stop_processes([temp_dir])
    if state is not None:  # only a directory relax made (it holds the state file) is removed
        shutil.rmtree(temp_dir, ignore_errors=True)
    return stopped


def status(temp_dir: str = DEFAULT_DIR) -> dict | None:
    """The state of the cluster of ``temp_dir`` when it is really up (``_is_up``), else None."""
    state = _state(temp_dir)
    return state if _is_up(state) else None
