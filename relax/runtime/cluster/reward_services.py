"""The reward services of a run: ``--reward-model-path`` and ``--judge-model-path`` as Ray Serve
deployments with dynamic batching, shared by every rollout worker.

Each service is one Serve app whose replicas (``--reward-model-replicas``) load the model once and
score the samples that arrive within ``--reward-model-batch-wait-s`` of each other, up to
``--reward-model-batch-size`` at a time, in one forward pass (``@serve.batch``). A replica requests
``--reward-model-cpus`` CPUs and ``--reward-model-gpus`` GPUs (default: an equal share, at most one,
of the GPUs the workers leave free). Every answer carries the id and size of the batch it was scored
in, from which the rollout workers report ``reward_model/batch_size_mean`` (``judge/...`` alike).

``RewardServices`` is the driver's side: it deploys the apps in a thread while the workers start
(after the advantages app, so that only one thread starts Serve), makes one real call of each
service before training (a failure names the service), hands the handles to the rollout workers,
and deletes the apps of a run that joined a cluster. Settings as docs/en/ray-and-transferqueue.md
#serve-settings: no HTTP proxy, access logs off, fast graceful shutdown.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from relax.rollout.reward_services import Service, services_of
from relax.runtime.data.data_plane import RUN_PREFIX_ENV
from relax.runtime.files.console import log
from relax.runtime.session.waits import WorkerDied, get

APP_PREFIX = "relax_"
CHECK_SAMPLE = ("What is 2 + 3?", " 5", "5")  # the real call before training: (prompt, completion, label)


def service_gpus(free_gpus: float, replicas: int) -> float:
    """GPUs per replica when the flag is not given: an equal share of the free GPUs, at most one."""
    return min(1.0, free_gpus / replicas) if free_gpus > 0 and replicas else 0.0


def service_settings(config, metric: str, free_gpus: float, total_replicas: int) -> dict:
    """The deployment's settings for ``metric`` ("reward_model" or "judge") from the run's flags."""
    c = config
    if metric == "reward_model":
        settings = {"path": c.reward_model_path, "template": None, "replicas": c.reward_model_replicas,
                    "batch_size": c.reward_model_batch_size, "batch_wait_s": c.reward_model_batch_wait_s,
                    "cpus": c.reward_model_cpus, "gpus": c.reward_model_gpus}
    else:
        with open(c.judge_template, encoding="utf-8") as f:
            template = f.read()
        settings = {"path": c.judge_model_path, "template": template, "replicas": c.judge_replicas,
                    "batch_size": c.judge_batch_size, "batch_wait_s": c.judge_batch_wait_s,
                    "cpus": c.judge_cpus, "gpus": c.judge_gpus}
    settings["path"] = os.path.abspath(settings["path"])  # a replica's working directory is not the driver's
    if settings["gpus"] is None:
        settings["gpus"] = service_gpus(free_gpus, total_replicas)
    return {"kind": metric, **settings}


def total_replicas(config) -> int:
    c = config
    return (c.reward_model_replicas if c.reward_model_path else 0) + (c.judge_replicas if c.judge_model_path else 0)


def make_deployment(settings: dict):
    """The Serve deployment of one service (built lazily so importing this module does not import Serve)."""
    from ray import serve

    @serve.deployment(
        name=settings["kind"],
        num_replicas=settings["replicas"],
        ray_actor_options={"num_cpus": settings["cpus"], "num_gpus": settings["gpus"]},
        # every sample of a step is one request: room for a full batch and the next one queueing
        max_ongoing_requests=max(64, 2 * settings["batch_size"]),
        graceful_shutdown_wait_loop_s=0.1,
        graceful_shutdown_timeout_s=0.5,
        health_check_period_s=10,
    )
    class RewardServiceDeployment:
        def __init__(self, settings: dict):
            import uuid

            import torch

            from relax.rollout.reward_scorers import JudgeScorer, SequenceScorer

            torch.set_num_threads(max(1, int(settings["cpus"])))
            use_gpu = settings["gpus"] > 0
            self.scorer = (SequenceScorer(settings["path"], use_gpu) if settings["kind"] == "reward_model"
                           else JudgeScorer(settings["path"], settings["template"], use_gpu))
            self.replica, self.calls = uuid.uuid4().hex[:8], 0
            self.score_batch.set_max_batch_size(settings["batch_size"])
            self.score_batch.set_batch_wait_timeout_s(settings["batch_wait_s"])

        @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.01)
        async def score_batch(self, samples: list) -> list[dict]:
            self.calls += 1
            batch = f"{self.replica}-{self.calls}"
            return [{"score": s, "batch": batch, "size": len(samples)} for s in self.scorer.score(samples)]

        async def __call__(self, sample) -> dict:
            return await self.score_batch(tuple(sample))

    return RewardServiceDeployment.bind(settings)


class RewardServices:
    """The run's reward services, from deployment to teardown (see the module docstring)."""

    def __init__(self, config, free_gpus: float):
        self.config, self.free_gpus = config, free_gpus
        self.services: list[Service] = services_of(config)
        self.handles: dict = {}
        self.apps: list[str] = []
        self.placements: list[str] = []  # where each service's replicas run, for the start-up line
        self.ready_at: float | None = None
        self._error: str | None = None
        self._thread: threading.Thread | None = None

    def start(self, after: threading.Thread | None = None) -> None:
        """Deploy in a thread, once ``after`` (the advantages deployment, which starts Serve) is done;
        first refuse requests the cluster can never meet (``resource_fit``), which Serve would
        leave waiting to be scheduled until the start-up timeout."""
        if self.services:
            import ray

            from relax.runtime.checks.resource_fit import cluster_problem

            total = ray.cluster_resources()
            gpus = total.get("GPU", 0.0)
            problem = cluster_problem(self.config, total.get("CPU", 0.0), gpus, max(0.0, gpus - self.free_gpus))
            if problem:
                raise WorkerDied(problem)
            self._thread = threading.Thread(target=self._deploy, args=(after,), daemon=True)
            self._thread.start()

    def _deploy(self, after) -> None:
        from ray import serve

        if after is not None:
            after.join()
        logging.getLogger("ray.serve").setLevel(logging.WARNING)
        quiet = {"enable_access_log": False, "log_level": "WARNING"}
        prefix = os.environ.get(RUN_PREFIX_ENV)
        suffix = f"_{prefix.rstrip('_')}" if prefix and self.config.ray_address else ""
        replicas = total_replicas(self.config)
        try:
            serve.start(proxy_location="Disabled", logging_config=quiet)
            for s in self.services:
                name = f"{APP_PREFIX}{s.metric}{suffix}"
                settings = service_settings(self.config, s.metric, self.free_gpus, replicas)
                self.handles[s.metric] = serve.run(make_deployment(settings), name=name, route_prefix=None,
                                                   logging_config=quiet)
                self.apps.append(name)
                where = f"{settings['gpus']:g} GPU each" if settings["gpus"] > 0 else "the CPU"
                self.placements.append(f"{s.title}: {settings['replicas']} replica(s) on {where}")
            self.ready_at = time.perf_counter()
        except Exception as exc:  # noqa: BLE001 - reported by connect() on the main thread
            self._error = f"{type(exc).__name__}: {exc}"

    def connect(self, rollouts: list, timeout: float) -> None:
        """Wait for the deployments, call each service once, and give the handles to the rollout workers."""
        if self._thread is None:
            return
        self._thread.join(timeout)
        names = ", ".join(s.title for s in self.services)
        if self._thread.is_alive():
            raise WorkerDied(
                f"{names} did not start on Ray Serve within {timeout:.0f}s; check `ray status` for free CPUs/GPUs "
                "(--reward-model-cpus / --reward-model-gpus, --judge-cpus / --judge-gpus)"
            )
        if self._error is not None:
            raise WorkerDied(f"{names} failed to start on Ray Serve: {self._error}")
        for s in self.services:
            self.check(s, timeout)
        log("relax: devices: " + "; ".join(self.placements))
        get([r.set_reward_services.remote(self.handles) for r in rollouts], "rollout", timeout=timeout)

    def check(self, service: Service, timeout: float) -> float:
        """One real call of ``service`` before training (its model loaded, its answer a finite number)."""
        import math

        try:
            out = self.handles[service.metric].remote(CHECK_SAMPLE).result(timeout_s=timeout)
            value = float(out["score"])
        except Exception as exc:  # noqa: BLE001 - the service named, the first line of its error
            lines = [x for x in str(exc).splitlines() if x.strip()]
            raise WorkerDied(f"pre-flight call of {service.title} on the sample {CHECK_SAMPLE}: "
                             f"{type(exc).__name__}: {lines[-1] if lines else ''}") from None
        if not math.isfinite(value):
            raise WorkerDied(f"pre-flight call of {service.title} returned {value} (not finite)")
        return value

    def stop(self) -> None:
        """Delete the apps (a cluster the run joined keeps its Serve for the next run)."""
        from ray import serve

        for name in self.apps:
            serve.delete(name)
        self.apps = []
