"""Starting Ray for a run, or joining ``--ray-address``: the workers' environment, a bounded check
that the address answers, the signal handler Ray would replace, and Ray's relayed output sent to
stderr without its shutdown noise."""

from __future__ import annotations

import contextlib
import logging
import os
import threading

from relax.runtime.checks.resource_fit import WORKER_CPUS, own_ray_cpus
from relax.runtime.data import lazy_dynamo
from relax.runtime.data.data_plane import RUN_PREFIX_ENV
from relax.runtime.data.environment import RAY_ENV_DEFAULTS, apply_environment_defaults
from relax.runtime.session.cluster_watch import ClusterWatch
from relax.runtime.session.reaper import Watchdog, sweep
from relax.runtime.session.shipping import cluster_runtime_env
from relax.runtime.session.waits import bounded


def _runtime_env(config) -> dict:
    """Workers must import what the driver imports, including a user's ``my_pkg.my_mod:MyAlgo``
    from the current directory: on a local cluster through PYTHONPATH; on a cluster the run joins,
    by shipping the user's modules only (``relax.runtime.session.shipping``: never the whole directory, which
    may be huge and would shadow the installed relax). ``--ray-working-dir`` ships a directory."""
    env = {k: os.environ.get(k, v) for k, v in RAY_ENV_DEFAULTS.items()}
    if RUN_PREFIX_ENV in os.environ:
        env[RUN_PREFIX_ENV] = os.environ[RUN_PREFIX_ENV]
    # every worker process defers torch._dynamo's import (relax.runtime.data.lazy_dynamo)
    hook = {"worker_process_setup_hook": lazy_dynamo.HOOK}
    if config.ray_address or config.ray_working_dir:
        return {"env_vars": env, **hook, **cluster_runtime_env(config)}
    paths = [os.getcwd()] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return {"env_vars": env, **hook}


def worker_env_vars(config) -> dict:
    """The environment variables the run's workers get (a pre-started worker is given them at
    setup: relax.runtime.cluster.worker_pool)."""
    return dict(_runtime_env(config)["env_vars"])


def start_ray(config) -> bool:
    """Start a local Ray or join ``ray_address``; returns True when this call started/joined it."""
    apply_environment_defaults()
    import ray

    if ray.is_initialized():
        return False  # e.g. the test session's shared cluster: use it, leave it running
    import uuid

    os.environ[RUN_PREFIX_ENV] = f"run{uuid.uuid4().hex[:10]}_"  # for this process and, below, its workers
    # Worker logs reach the driver (errors must be visible); Ray's and Serve's INFO chatter does not.
    kwargs = {"include_dashboard": False, "log_to_driver": True, "logging_level": "WARNING",
              "runtime_env": _runtime_env(config)}
    import signal

    # ray.init replaces the SIGTERM handler (with one that calls sys.exit(15)); keep the caller's
    # (``relax train`` turns SIGTERM into the Ctrl-C shutdown).
    on_main = threading.current_thread() is threading.main_thread()
    sigterm = signal.getsignal(signal.SIGTERM) if on_main else None
    try:
        if config.ray_address:
            from relax.runtime.preflight.ray_address import check_ray_address

            check_ray_address(config.ray_address)
            ray.init(address=config.ray_address, **kwargs)
            global _CLUSTER_WATCH
            _CLUSTER_WATCH = ClusterWatch(config.ray_address).start()  # one line if it goes away mid-run
        else:
            global _WATCHDOG
            _WATCHDOG = Watchdog()  # kills the cluster's processes should this process be killed
            # TransferQueue's controller and storage unit each ask for a whole CPU: more logical CPUs
            # than cores (docs/en/ray-and-transferqueue.md, TransferQueue workarounds, item 1); the workers ask for a fraction each.
            cpus = max(4, os.cpu_count() or 1, 2 + WORKER_CPUS * (config.actor_num_workers + config.rollout_num_workers + 3),
                       own_ray_cpus(config))  # every role and reward service scheduled at once
            ray.init(num_cpus=int(cpus + 0.999), object_store_memory=512 * 2**20, **kwargs)
    except SystemExit as exc:
        # SIGTERM during ray.init reaches Ray's own handler (sys.exit(15)): hand it to the caller's,
        # which shuts the run down like Ctrl-C (relax train: exit 143), the half-started cluster included.
        if exc.code == signal.SIGTERM and callable(sigterm):
            signal.signal(signal.SIGTERM, sigterm)
            sigterm(signal.SIGTERM, None)
        raise
    finally:
        if callable(sigterm):
            signal.signal(signal.SIGTERM, sigterm)
    _relay_worker_output()
    return True


_WATCHDOG: Watchdog | None = None
_CLUSTER_WATCH: ClusterWatch | None = None


def stop_ray() -> None:
    """Stop the cluster this process started (``ray.shutdown()``, bounded), then kill whatever Ray
    process of it is left (``relax.runtime.session.reaper``) and let the watchdog go."""
    import ray

    global _WATCHDOG, _CLUSTER_WATCH
    watchdog, _WATCHDOG = _WATCHDOG, None
    if _CLUSTER_WATCH is not None:
        _CLUSTER_WATCH.stop()
        _CLUSTER_WATCH = None
    bounded(ray.shutdown, "stopping Ray")
    sweep(exclude=(watchdog.pid,) if watchdog is not None and watchdog.pid else ())
    if watchdog is not None:
        watchdog.close()


# Lines Ray relays from its processes that are shutdown noise, not news: Serve's controller ends
# itself at serve.shutdown() and its pending calls are reported as "failed ... killed by `ray.kill`";
# TransferQueue warns about a partition already dropped. And Serve's controller warns every 30 s that
# the advantages replica "taken more than 30s to be scheduled" while a loaded machine starts the run:
# relax's own start-up waits report a replica or worker that never starts, naming it.
RELAYED_NOISE = ("killed by `ray.kill`", "non-existent partition", "taken more than 30s to be scheduled")


def _relay_worker_output() -> None:
    """Ray prints what its processes write (and raylet's error messages) on the driver's stdout; send
    it to stderr instead (stdout carries only what relax prints, e.g. JSON a script reads) and drop
    ``RELAYED_NOISE``. Ray's private printer is wrapped (both its log relay and its error-message
    listener call it); when that API changes, Ray's own printing stays in place."""
    with contextlib.suppress(Exception):
        from ray._private import worker as ray_worker
        from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

        original = getattr(ray_worker.print_to_stdstream, "relax_original", ray_worker.print_to_stdstream)

        def relay(data, ignore_prefix):
            lines = [line for line in data.get("lines", []) if not any(n in line for n in RELAYED_NOISE)]
            if lines:
                original({**data, "lines": lines, "is_err": True}, ignore_prefix)

        relay.relax_original = original
        ray_worker.print_to_stdstream = relay
        ignore_prefix = ray_worker._should_ignore_worker_log_prefix(ray_worker.global_worker)
        dispatcher.remove_handler("ray_print_logs")
        dispatcher.add_handler("ray_print_logs", lambda data: relay(data, ignore_prefix))


class _DropNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not any(n in record.getMessage() for n in RELAYED_NOISE)


def quiet_transferqueue_client() -> None:
    """The driver's TransferQueue client warns when a partition it clears is already gone (the
    step's data was dropped, which is what clearing wants): ``RELAYED_NOISE``, not news."""
    logger = logging.getLogger("transfer_queue.client")
    if not any(isinstance(f, _DropNoise) for f in logger.filters):
        logger.addFilter(_DropNoise())
