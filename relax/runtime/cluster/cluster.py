"""The cluster side of a run: Ray start-up (or joining ``--ray-address``), GPU placement, and the
live roles of one run (``Runtime``: the Ray actors, the Serve app, the data plane) with their
teardown. The step pipeline that drives them is ``relax.runtime.driver.pipeline``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time

from relax.backends.registry import get_backend
from relax.runtime.checks import roles as R
from relax.runtime.cluster.kept_advantages import close_run as close_kept_run
from relax.runtime.cluster.kept_advantages import open_run as open_kept_run
from relax.runtime.cluster.kept_advantages import shares_kept_app
from relax.runtime.cluster.worker_pool import claim as claim_workers
from relax.runtime.data.data_plane import RUN_PREFIX_ENV
from relax.runtime.files.console import log
from relax.runtime.session.heartbeat import Heartbeats
from relax.runtime.session.ray_session import (
    WORKER_CPUS,
    quiet_transferqueue_client,
    start_ray,
    stop_ray,
    worker_env_vars,
)
from relax.runtime.session.reaper import kill_pids
from relax.runtime.session.shipping import with_absolute_paths
from relax.runtime.session.waits import (
    WorkerDied,
    bounded,
    dead_component,
    get,
    transferqueue_components,
    watch_components,
    watch_heartbeats,
)
from relax.runtime.step.placement import placement_line
from relax.runtime.weights.weight_sync import make_weight_sync

STARTUP_TIMEOUT_S = 300


def gpu_requests(cluster_gpus: float, actor_workers: int, rollout_workers: int = 1,
                 service_replicas: int = 0) -> tuple[float, float]:
    """``(num_gpus per actor rank, num_gpus per rollout worker)`` for a cluster with ``cluster_gpus`` GPUs.

    One GPU each when there are enough; a single actor rank shares one GPU with a single rollout
    worker (half each, or a third each when ``service_replicas`` reward-model/judge replicas without
    their own ``--*-gpus`` take the rest of that GPU, and so on); otherwise none is requested (CPU, or
    whatever devices the workers see) because two NCCL ranks must never share a GPU. A share is a
    scheduling claim, not a memory limit: the processes on one GPU share its memory as they allocate.
    """
    if cluster_gpus >= actor_workers + rollout_workers:
        return 1.0, 1.0
    if actor_workers == 1 and rollout_workers == 1 and cluster_gpus >= 1:
        share = math.floor(1e4 / (2 + service_replicas)) / 1e4  # Ray counts GPU shares to 4 decimals
        return share, share
    return 0.0, 0.0


def auto_gpu_service_replicas(config) -> int:
    """The reward-model and judge replicas that take an equal share of the GPUs the workers leave free
    (their ``--reward-model-gpus`` / ``--judge-gpus`` not given)."""
    c = config
    return ((c.reward_model_replicas if c.reward_model_path and c.reward_model_gpus is None else 0)
            + (c.judge_replicas if c.judge_model_path and c.judge_gpus is None else 0))


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
        self.adv_run = None  # this run's name on the kept cluster's shared advantages app
        self.reward_services = None  # --reward-model-path / --judge-model-path (relax.runtime.cluster.reward_services)
        self._serve_error = "unknown error"
        self.startup_times: dict[str, float] = {}
        self.pool_claim = None
        self.heartbeats = Heartbeats(config.worker_timeout)  # relax.runtime.session.heartbeat
        self.weight_sync = None  # the run's weight transport (relax.runtime.weights.weight_sync), built in start()

    def start(self) -> None:
        """Start the run's roles, in the order that overlaps the slow parts: Ray, then every worker
        spawned (their processes import torch meanwhile), the Serve deployments and TransferQueue, then
        the wait for the workers, their process group and the connections between the roles."""
        # a joined cluster's workers do not run in this directory: relative data paths made absolute
        cfg = with_absolute_paths(self.config) if self.config.ray_address else self.config
        t0, wall0 = time.perf_counter(), time.time()
        gpus = self._start_ray(cfg, t0)
        actor_gpus, rollout_gpus = self._gpu_requests(cfg, gpus)
        names = self._spawn_workers(cfg, actor_gpus, rollout_gpus)
        workers = [*self.rollouts, *self.actors] + ([self.critic] if self.critic else [])
        # queued behind each worker's __init__: its heartbeat, and when its __init__ ended
        beats = self.heartbeats.install(
            [(f"rollout worker {i}", x) for i, x in enumerate(self.rollouts)]
            + [(f"actor rank {r}", x) for r, x in enumerate(self.actors)]
            + ([("critic worker", self.critic)] if self.critic else [])
        )
        serve_thread = self._start_services(cfg, gpus - cfg.actor_num_workers * actor_gpus
                                            - cfg.rollout_num_workers * rollout_gpus, t0)
        devices = self._wait_for_workers(workers, names, beats, t0, wall0)
        if cfg.actor_num_workers > 1:
            address = get(self.actors[0].free_address.remote(), "actor", timeout=STARTUP_TIMEOUT_S)
            get([a.init_process_group.remote(address) for a in self.actors], "actor", timeout=STARTUP_TIMEOUT_S)
        self._connect_weights(devices)
        if serve_thread is not None:
            self._connect_advantages(serve_thread, t0)
        self.reward_services.connect(self.rollouts, STARTUP_TIMEOUT_S)  # one real call of each, then the workers

    def _start_ray(self, cfg, t0: float) -> float:
        """Start Ray (or join ``--ray-address``); -> the cluster's GPUs."""
        import ray

        # Set before Ray starts: a SIGTERM during start-up must still stop what was started.
        self.started_ray = not ray.is_initialized()
        start_ray(cfg)
        # Phases as "ready at" seconds since the start of start-up (benchmarks/startup.py reads them).
        self.startup_times["ray_s"] = time.perf_counter() - t0
        return ray.cluster_resources().get("GPU", 0.0)

    def _gpu_requests(self, cfg, gpus: float) -> tuple[float, float]:
        """``(num_gpus per actor rank, per rollout worker)`` on this cluster (``gpu_requests``), said when none."""
        w = cfg.actor_num_workers
        actor_gpus, rollout_gpus = gpu_requests(gpus, w, cfg.rollout_num_workers, auto_gpu_service_replicas(cfg))
        if gpus and not actor_gpus:
            log(f"relax: warning: {gpus:g} GPU(s) for {w} actor rank(s) + {cfg.rollout_num_workers} rollout "
                "worker(s); requesting none (NCCL ranks cannot share a GPU)")
        return actor_gpus, rollout_gpus

    def _spawn_workers(self, cfg, actor_gpus: float, rollout_gpus: float) -> list[str]:
        """The rollout workers, actor ranks and critic: the kept cluster's pre-started ones when it has
        them, else new Ray actors (not waited for); -> their names, in ``rollouts, actors, critic`` order."""
        import ray

        from relax.runtime.step.actor_worker import ActorWorker
        from relax.runtime.step.critic_worker import CriticWorker
        from relax.runtime.step.rollout_worker import RolloutWorker

        spec, w = cfg.advantage_estimator, cfg.actor_num_workers
        # SPREAD: on a cluster of several machines the workers go to different nodes (on one machine
        # it changes nothing).
        opts = {"num_cpus": WORKER_CPUS, "max_restarts": 0, "scheduling_strategy": "SPREAD"}
        with_ref = R.REFERENCE in self.layout
        on_actor = self.layout.placement[R.ADVANTAGES] == R.ON_ACTOR
        self.weight_sync = make_weight_sync(cfg)  # --weight-transport, chosen once and handed to each worker
        rollout_args = [((cfg, spec, i), {"weight_sync": self.weight_sync}) for i in range(cfg.rollout_num_workers)]
        actor_args = [((cfg, spec, r, w), {"with_reference": with_ref, "advantages_on_actor": on_actor,
                                           "with_teacher": R.TEACHER in self.layout, "weight_sync": self.weight_sync})
                      for r in range(w)]
        # A kept cluster's pre-started workers (relax.runtime.cluster.worker_pool), when it has them.
        self.pool_claim, why_not = claim_workers(cfg, {"rollout": len(rollout_args), "actor": w},
                                                 worker_env_vars(cfg), gpus=bool(actor_gpus or rollout_gpus))
        if why_not:
            log(f"relax: the kept cluster's pre-started workers are not used: {why_not}")
        if self.pool_claim is not None:
            self.rollouts = self.pool_claim.setup("rollout", rollout_args)
            self.actors = self.pool_claim.setup("actor", actor_args)
            log(f"relax: {len(self.rollouts) + w} pre-started worker(s) from the kept cluster's pool")
        else:
            # Spawn every worker first: their processes start and import torch in parallel with the
            # TransferQueue and Serve start-up that follows.
            self.rollouts = [ray.remote(RolloutWorker).options(**opts, num_gpus=rollout_gpus).remote(*a, **k)
                             for a, k in rollout_args]
            self.actors = [ray.remote(ActorWorker).options(**opts, num_gpus=actor_gpus).remote(*a, **k)
                           for a, k in actor_args]
        if R.CRITIC in self.layout:
            self.critic = ray.remote(CriticWorker).options(**opts).remote(cfg)
        return ([f"rollout{i}" for i in range(len(self.rollouts))] + [f"actor{r}" for r in range(w)]
                + (["critic"] if self.critic else []))

    def _start_services(self, cfg, free_gpus: float, t0: float):
        """The advantages deployment (Ray Serve, on a thread; none when the actor computes them), the
        reward services and the TransferQueue data plane; -> the Serve thread, or None."""
        from relax.runtime.cluster.reward_services import RewardServices
        from relax.runtime.data.data_plane import TransferQueueDataPlane

        serve_thread = None
        if self.layout.placement[R.ADVANTAGES] != R.ON_ACTOR:
            serve_thread = threading.Thread(target=self._deploy_advantages, daemon=True)
            serve_thread.start()
        self.reward_services = RewardServices(cfg, free_gpus)
        self.reward_services.start(after=serve_thread)  # Serve is started by one thread at a time
        # on a cluster the run joined, TransferQueue is kept up for the next run (the warm path)
        self.data_plane = TransferQueueDataPlane().start(keep=bool(cfg.ray_address))
        watch_components(transferqueue_components())
        quiet_transferqueue_client()
        self.startup_times["transferqueue_s"] = time.perf_counter() - t0
        return serve_thread

    def _wait_for_workers(self, workers: list, names: list[str], beats, t0: float, wall0: float) -> list[str]:
        """Wait until every worker is constructed and beating; record when each was ready and where it
        runs; -> each worker's device, in words."""
        if self.pool_claim is not None:
            get(self.pool_claim.setups, "start-up", timeout=STARTUP_TIMEOUT_S)
        nodes = get([x.attach.remote() for x in workers], "start-up", timeout=STARTUP_TIMEOUT_S)
        started = get(beats, "start-up", timeout=STARTUP_TIMEOUT_S)
        self.heartbeats.started([(pid, ip) for pid, ip, _ in started])
        watch_heartbeats(self.heartbeats)
        for name, (_, _, init_done) in zip(names, started):
            self.startup_times[f"{name}_init_s"] = init_done - wall0  # its process, imports and __init__
        self.startup_times["workers_ready_s"] = time.perf_counter() - t0
        log(f"relax: {len(workers)} worker(s) on {len(set(nodes))} node(s)")
        devices = get([x.device.remote() for x in workers], "start-up", timeout=STARTUP_TIMEOUT_S)
        log(placement_line(names, devices))
        return devices

    def _connect_weights(self, devices: list[str]) -> None:
        """The weight transport's own group of actor rank 0 and the rollout workers, apart from the
        actor ranks' (``WeightSync.connect``; nothing to join for the object store)."""
        n = len(self.rollouts)
        joined = self.weight_sync.connect(self.actors[0], self.rollouts, [devices[n], *devices[:n]],  # sender first
                                          lambda refs: get(refs, "weight transport", timeout=STARTUP_TIMEOUT_S))
        if joined:
            log(joined)

    def _connect_advantages(self, serve_thread: threading.Thread, t0: float) -> None:
        """Wait for the advantages deployment and hand its handle to actor rank 0, which sends each
        step's request itself (see relax.runtime.driver.pipeline)."""
        serve_thread.join(STARTUP_TIMEOUT_S)
        if serve_thread.is_alive():
            raise WorkerDied(
                f"the advantages deployment (Ray Serve) did not start within {STARTUP_TIMEOUT_S}s; check "
                "`ray status` for free CPUs, or pass --advantages-on-actor to run without Serve"
            )
        if self.adv_handle is None:
            raise WorkerDied(f"the advantages deployment failed to start: {self._serve_error}")
        self.startup_times["serve_ready_s"] = self._serve_ready - t0
        get(self.actors[0].set_advantages_service.remote(self.adv_handle, self.adv_run), "actor",
            timeout=STARTUP_TIMEOUT_S)

    def _deploy_advantages(self) -> None:
        try:
            from ray import serve
        except Exception as exc:  # noqa: BLE001 - reported by start() on the main thread
            # e.g. grpcio-reflection not matching the installed grpcio: Serve's import fails, not the run's
            self._serve_error = (f"Ray Serve could not be imported ({type(exc).__name__}: {exc}); check that "
                                 "`python -c 'from ray import serve'` works, or pass --advantages-on-actor "
                                 "to run without Serve")
            return
        from relax.runtime.session.deployments import APP_NAME, make_deployment

        logging.getLogger("ray.serve").setLevel(logging.WARNING)
        quiet = {"enable_access_log": False, "log_level": "WARNING"}
        try:
            serve.start(proxy_location="Disabled", logging_config=quiet)
            prefix = os.environ.get(RUN_PREFIX_ENV)
            if self.pool_claim is not None and prefix and shares_kept_app(self.config.advantage_estimator):
                # the kept cluster's shared app (relax.runtime.cluster.kept_advantages): no replica to start
                self.adv_handle = open_kept_run(self.config.advantage_estimator, self.config.algorithm, prefix, quiet)
                self.adv_run = prefix
                self._serve_ready = time.perf_counter()
                return
            # one app per run on a kept cluster (several runs may share its Serve)
            name = f"{APP_NAME}_{prefix.rstrip('_')}" if prefix and self.config.ray_address else APP_NAME
            app = make_deployment().bind(self.config.advantage_estimator, self.config.algorithm, prefix)
            self.adv_handle = serve.run(app, name=name, route_prefix=None, logging_config=quiet)
            self.serve_app = name
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
        watch_heartbeats(None)

        def stop_serve():
            from ray import serve

            serve.delete(self.serve_app)

        # A cluster this run started goes down whole with ray.shutdown() below; stopping Serve first
        # would only wait for its graceful shutdown (up to 20 s) and make Ray report the controller it
        # kills. On a cluster the run joined, only the run's app is deleted.
        if self.serve_app is not None and (not self.started_ray or self.config.ray_address):
            bounded(stop_serve, "stopping the advantages deployment")
        if self.adv_run is not None:
            bounded(lambda: close_kept_run(self.adv_handle, self.adv_run), "closing the run on the kept advantages app")
        if self.reward_services is not None and (not self.started_ray or self.config.ray_address):
            bounded(self.reward_services.stop, "stopping the reward services")
        for handle in [*self.rollouts, *self.actors, self.critic]:
            if handle is not None:
                with contextlib.suppress(Exception):
                    ray.kill(handle)
        # A stopped or stuck worker on this machine cannot act on ray.kill: end its process here.
        kill_pids(self.heartbeats.silent_pids_on_this_machine())
        if self.pool_claim is not None:
            self.pool_claim.release()  # the pool boots replacements for the next run
        self.heartbeats.forget()
        if self.data_plane is not None and dead is None:
            # what the run left (matters when TransferQueue outlives the run), then its actors
            bounded(self.data_plane.clear_steps, "clearing the data plane")
            bounded(self.data_plane.close, "closing the data plane")
        if self.started_ray:
            stop_ray()


