"""The cluster side of a run: Ray start-up (or joining ``--ray-address``), GPU placement, and the
live roles of one run (``Runtime``: the Ray actors, the Serve app, the data plane) with their
teardown. The step pipeline that drives them is ``relax.runtime.pipeline``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time

from relax.backends.registry import get_backend
from relax.runtime import roles as R
from relax.runtime.environment import RAY_ENV_DEFAULTS, apply_environment_defaults

WORKER_CPUS = 0.25  # logical: Ray's CPUs are scheduling tokens, not cores
STARTUP_TIMEOUT_S = 300


class WorkerDied(RuntimeError):
    pass


def log(msg: str, bar=None) -> None:
    """A line on stderr (through the progress bar when one is shown, so it is not garbled)."""
    if bar is not None:
        bar.write(msg, file=sys.stderr)
    else:
        print(msg, file=sys.stderr, flush=True)


def _runtime_env(config) -> dict:
    """Workers must import what the driver imports, including a user's ``my_pkg.my_mod:MyAlgo``
    from the current directory: locally through PYTHONPATH, on a remote cluster by shipping the
    working directory."""
    cwd = os.getcwd()
    env = {k: os.environ.get(k, v) for k, v in RAY_ENV_DEFAULTS.items()}
    paths = [cwd] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    runtime_env = {"env_vars": env}
    if config.ray_address:
        runtime_env["working_dir"] = cwd
        runtime_env["excludes"] = ["outputs/", ".git/", "*.pt", "__pycache__/", ".tox/", "*.egg-info/"]
    return runtime_env


RAY_ADDRESS_TIMEOUT_S = 5.0


def check_ray_address(address: str, timeout: float = RAY_ADDRESS_TIMEOUT_S) -> None:
    """Raise ``ConnectionError`` unless something answers at ``--ray-address host:port`` within
    ``timeout`` seconds (``ray.init`` would wait forever). ``auto`` and addresses without a port
    are left to Ray."""
    import socket

    target = address.split("://", 1)[-1].rstrip("/")
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise ConnectionError(
            f"--ray-address {address}: nothing answers at {host}:{port} within {timeout:g}s "
            f"({exc.strerror or type(exc).__name__}); start the cluster (`ray start --head`), check the "
            "address with `ray status` on its head node, or omit --ray-address to start a local Ray"
        ) from None


def _start_ray(config) -> bool:
    """Start a local Ray or join ``ray_address``; returns True when this call started/joined it."""
    apply_environment_defaults()
    import ray

    if ray.is_initialized():
        return False  # e.g. the test session's shared cluster: use it, leave it running
    # Worker logs reach the driver (errors must be visible); Ray's and Serve's INFO chatter does not.
    kwargs = {"include_dashboard": False, "log_to_driver": True, "logging_level": "WARNING",
              "runtime_env": _runtime_env(config)}
    import signal

    # ray.init replaces the SIGTERM handler (with one that calls sys.exit(15)); keep the caller's
    # (``relax train`` turns SIGTERM into the Ctrl-C shutdown).
    on_main = threading.current_thread() is threading.main_thread()
    sigterm = signal.getsignal(signal.SIGTERM) if on_main else None
    if config.ray_address:
        check_ray_address(config.ray_address)
        ray.init(address=config.ray_address, **kwargs)
    else:
        # TransferQueue's controller and storage unit each ask for a whole CPU: more logical CPUs
        # than cores (docs/en/ray-and-transferqueue.md, TransferQueue workarounds, item 1); the workers ask for a fraction each.
        cpus = max(4, os.cpu_count() or 1, 2 + WORKER_CPUS * (config.actor_num_workers + config.rollout_num_workers + 3))
        ray.init(num_cpus=int(cpus + 0.999), object_store_memory=512 * 2**20, **kwargs)
    if callable(sigterm):
        signal.signal(signal.SIGTERM, sigterm)
    _relay_worker_output()
    return True


# Lines Ray relays from its processes that are shutdown noise, not news: Serve's controller ends
# itself at serve.shutdown() and its pending calls are reported as "failed ... killed by `ray.kill`";
# TransferQueue warns about a partition already dropped.
RELAYED_NOISE = ("killed by `ray.kill`", "non-existent partition")


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


# Components whose death fails every driver wait within seconds (``watch_components``): the
# TransferQueue controller and storage units. A dead worker already fails its own call; a dead
# TransferQueue component would only make the workers wait on it (minutes of retries).
LIVENESS_POLL_S = 2.0
_WATCHED: list[tuple[str, object]] = []


def watch_components(components: list[tuple[str, object]]) -> None:
    """``[(description, actor handle)]`` checked while the driver waits (empty: none)."""
    _WATCHED[:] = components


def dead_component() -> str | None:
    """The description of a watched component whose actor is dead, else None. A component busy
    with other calls (no answer within a second) counts as alive."""
    if not _WATCHED:
        return None
    import ray
    from ray.exceptions import RayActorError

    pings = []
    for name, handle in _WATCHED:
        try:
            pings.append((name, handle.__ray_ready__.remote()))
        except RayActorError:
            return name
    ready, _ = ray.wait([ref for _, ref in pings], num_returns=len(pings), timeout=1.0)
    ready = set(ready)
    for name, ref in pings:
        if ref in ready:
            try:
                ray.get(ref, timeout=0)
            except RayActorError:
                return name
            except Exception:  # noqa: BLE001, S110 - anything but "the actor is dead" is not our business here
                pass
    return None


def _wait_watching(refs, timeout: float | None) -> None:
    """Wait until every ref is ready (or ``timeout``), checking the watched components' liveness
    every ``LIVENESS_POLL_S`` seconds; a dead one raises ``WorkerDied`` naming it."""
    import ray

    pending = list(dict.fromkeys(refs if isinstance(refs, (list, tuple)) else [refs]))
    deadline = None if timeout is None else time.monotonic() + timeout
    while pending:
        wait = LIVENESS_POLL_S if deadline is None else min(LIVENESS_POLL_S, deadline - time.monotonic())
        if wait <= 0:
            return  # ray.get reports the timeout
        ready, pending = ray.wait(pending, num_returns=len(pending), timeout=wait)
        if ready:
            ray.get(ready)  # a failed call fails now, not after the others
        if pending:
            dead = dead_component()
            if dead is not None:
                raise WorkerDied(
                    f"the {dead} died; the run cannot continue without it (its data is lost). See the log "
                    "lines above for why (e.g. out of memory); restart the run, with --load to resume from "
                    "the last checkpoint"
                )


def get(refs, what: str, timeout: float | None = None):
    """``ray.get`` that turns a dead worker, or a dead watched component (TransferQueue), into one
    clear error naming it."""
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

    try:
        if _WATCHED:
            _wait_watching(refs, timeout)
        return ray.get(refs, timeout=timeout)
    except RayActorError as exc:
        raise WorkerDied(f"the {what} worker died: {exc}. See the worker log lines above.") from exc
    except RayTaskError as exc:
        cause = exc.as_instanceof_cause() if hasattr(exc, "as_instanceof_cause") else exc
        raise WorkerDied(f"the {what} worker failed: {type(cause).__name__}: {cause}") from exc
    except GetTimeoutError as exc:
        raise WorkerDied(
            f"the {what} worker did not answer within {timeout:.0f}s (not enough Ray CPUs for every worker, or "
            "stuck); check `ray status`"
        ) from exc


def gpu_requests(cluster_gpus: float, actor_workers: int, rollout_workers: int = 1) -> tuple[float, float]:
    """``(num_gpus per actor rank, num_gpus per rollout worker)`` for a cluster with ``cluster_gpus`` GPUs.

    One GPU each when there are enough; a single actor rank shares one GPU with a single rollout
    worker (half each); otherwise none is requested (CPU, or whatever devices the workers see)
    because two NCCL ranks must never share a GPU.
    """
    if cluster_gpus >= actor_workers + rollout_workers:
        return 1.0, 1.0
    if actor_workers == 1 and rollout_workers == 1 and cluster_gpus >= 1:
        return 0.5, 0.5
    return 0.0, 0.0


class Runtime:
    """The live roles of one run (Ray actors, the Serve app, the data plane) and their teardown."""

    def __init__(self, config, algorithm_cls, layout: R.RoleLayout):
        self.config, self.algorithm_cls, self.layout = config, algorithm_cls, layout
        self.backend_cls = get_backend(config.backend)
        self.started_ray = False
        self.serve_app = None
        self.data_plane = None
        self.rollouts: list = []  # one per --rollout-num-workers, in index order
        self.actors: list = []
        self.critic = None
        self.adv_handle = None
        self._serve_error = "unknown error"
        self.startup_times: dict[str, float] = {}

    def start(self) -> None:
        import ray

        from relax.runtime.actor_worker import ActorWorker
        from relax.runtime.critic_worker import CriticWorker
        from relax.runtime.data_plane import TransferQueueDataPlane
        from relax.runtime.rollout_worker import RolloutWorker

        cfg, algorithm_spec = self.config, self.config.advantage_estimator
        t0 = time.perf_counter()
        self.started_ray = _start_ray(cfg)
        self.startup_times["ray_init_s"] = time.perf_counter() - t0
        # SPREAD: on a cluster of several machines the workers go to different nodes (on one machine
        # it changes nothing).
        opts = {"num_cpus": WORKER_CPUS, "max_restarts": 0, "scheduling_strategy": "SPREAD"}
        w = cfg.actor_num_workers
        gpus = ray.cluster_resources().get("GPU", 0.0)
        actor_gpus, rollout_gpus = gpu_requests(gpus, w, cfg.rollout_num_workers)
        if gpus and not actor_gpus:
            log(f"relax: warning: {gpus:g} GPU(s) for {w} actor rank(s) + {cfg.rollout_num_workers} rollout "
                "worker(s); requesting none (NCCL ranks cannot share a GPU)")
        # Spawn every worker first: their processes start and import torch in parallel with the
        # TransferQueue and Serve start-up below.
        self.rollouts = [
            ray.remote(RolloutWorker).options(**opts, num_gpus=rollout_gpus).remote(cfg, algorithm_spec, i)
            for i in range(cfg.rollout_num_workers)
        ]
        with_ref = R.REFERENCE in self.layout
        on_actor = self.layout.placement[R.ADVANTAGES] == R.ON_ACTOR
        self.actors = [
            ray.remote(ActorWorker).options(**opts, num_gpus=actor_gpus).remote(
                cfg, algorithm_spec, r, w, with_reference=with_ref, advantages_on_actor=on_actor
            )
            for r in range(w)
        ]
        if R.CRITIC in self.layout:
            self.critic = ray.remote(CriticWorker).options(**opts).remote(cfg)
        serve_thread = None
        if not on_actor:
            serve_thread = threading.Thread(target=self._deploy_advantages, daemon=True)
            serve_thread.start()
        self.data_plane = TransferQueueDataPlane().start()
        watch_components(_transferqueue_components())
        _quiet_transferqueue_client()
        self.startup_times["transferqueue_s"] = time.perf_counter() - t0 - self.startup_times["ray_init_s"]
        workers = [*self.rollouts, *self.actors] + ([self.critic] if self.critic else [])
        nodes = get([x.attach.remote() for x in workers], "start-up", timeout=STARTUP_TIMEOUT_S)
        self.startup_times["workers_ready_s"] = time.perf_counter() - t0
        log(f"relax: {len(workers)} worker(s) on {len(set(nodes))} node(s)")
        if w > 1:
            address = get(self.actors[0].free_address.remote(), "actor", timeout=STARTUP_TIMEOUT_S)
            get([a.init_process_group.remote(address) for a in self.actors], "actor", timeout=STARTUP_TIMEOUT_S)
        if serve_thread is not None:
            serve_thread.join(STARTUP_TIMEOUT_S)
            if serve_thread.is_alive():
                raise WorkerDied(
                    f"the advantages deployment (Ray Serve) did not start within {STARTUP_TIMEOUT_S}s; check "
                    "`ray status` for free CPUs, or pass --advantages-on-actor to run without Serve"
                )
            if self.adv_handle is None:
                raise WorkerDied(f"the advantages deployment failed to start: {self._serve_error}")
            self.startup_times["serve_ready_s"] = self._serve_ready - t0
            # rank 0 sends each step's request itself (see relax.runtime.pipeline)
            get(self.actors[0].set_advantages_service.remote(self.adv_handle), "actor", timeout=STARTUP_TIMEOUT_S)

    def _deploy_advantages(self) -> None:
        import logging

        from ray import serve

        from relax.runtime.advantages import APP_NAME, make_deployment

        logging.getLogger("ray.serve").setLevel(logging.WARNING)
        quiet = {"enable_access_log": False, "log_level": "WARNING"}
        try:
            serve.start(proxy_location="Disabled", logging_config=quiet)
            app = make_deployment().bind(self.config.advantage_estimator, self.config.algorithm)
            self.adv_handle = serve.run(app, name=APP_NAME, route_prefix=None, logging_config=quiet)
            self.serve_app = APP_NAME
            self._serve_ready = time.perf_counter()
        except Exception as exc:  # noqa: BLE001 - reported by start() on the main thread
            self._serve_error = f"{type(exc).__name__}: {exc}"

    def stop(self) -> None:
        """Shut the run's roles down. Every step is bounded (``STOP_STEP_TIMEOUT_S``): a dead
        TransferQueue controller or Serve app must not keep the run from exiting."""
        import ray

        # A dead TransferQueue component: nothing left to clear, and clearing would only wait for it.
        dead = dead_component()
        watch_components([])

        def stop_serve():
            from ray import serve

            serve.delete(self.serve_app)

        # A cluster this run started goes down whole with ray.shutdown() below; stopping Serve first
        # would only wait for its graceful shutdown (up to 20 s) and make Ray report the controller it
        # kills. On a cluster the run joined, only the run's app is deleted.
        if self.serve_app is not None and not self.started_ray:
            _bounded(stop_serve, "stopping the advantages deployment")
        for handle in [*self.rollouts, *self.actors, self.critic]:
            if handle is not None:
                with contextlib.suppress(Exception):
                    ray.kill(handle)
        if self.data_plane is not None and dead is None:
            # what the run left (matters when TransferQueue outlives the run), then its actors
            _bounded(self.data_plane.clear_steps, "clearing the data plane")
            _bounded(self.data_plane.close, "closing the data plane")
        if self.started_ray:
            with contextlib.suppress(Exception):
                ray.shutdown()


STOP_STEP_TIMEOUT_S = 20.0


def _bounded(fn, what: str, timeout: float = STOP_STEP_TIMEOUT_S) -> bool:
    """Run ``fn`` in a daemon thread for at most ``timeout`` seconds (errors are ignored: this is
    shutdown); returns whether it finished, and says so on stderr when it did not."""
    thread = threading.Thread(target=_quietly, args=(fn,), name="relax-stop", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        log(f"relax: warning: {what} did not finish within {timeout:.0f}s; skipped")
        return False
    return True


def _quietly(fn) -> None:
    with contextlib.suppress(Exception):
        fn()


class _DropNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not any(n in record.getMessage() for n in RELAYED_NOISE)


def _quiet_transferqueue_client() -> None:
    """The driver's TransferQueue client warns when a partition it clears is already gone (the
    step's data was dropped, which is what clearing wants): ``RELAYED_NOISE``, not news."""
    logger = logging.getLogger("transfer_queue.client")
    if not any(isinstance(f, _DropNoise) for f in logger.filters):
        logger.addFilter(_DropNoise())


def _transferqueue_components() -> list[tuple[str, object]]:
    """The TransferQueue controller and (when this process started them) its storage units."""
    components = []
    with contextlib.suppress(Exception):
        import ray

        components.append(("TransferQueue controller (actor TransferQueueController)",
                           ray.get_actor("TransferQueueController", namespace="transfer_queue")))
    with contextlib.suppress(Exception):
        from transfer_queue import interface

        for backend in (interface._TQ_STORAGE or {}).values():
            for name, handle in dict(backend).items():
                components.append((f"TransferQueue storage unit (actor {name})", handle))
    return components
