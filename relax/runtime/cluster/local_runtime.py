"""``--in-process``: the run's roles in the driver's own process, behind the interface of
``relax.runtime.cluster.cluster.Runtime``, so that ``relax.runtime.driver.train.run`` — the step pipeline, the
evaluation, checkpoints and resume, trackers and metrics — runs unchanged.

What starts: the rollout worker and the actor rank (the Ray path's own ``RolloutWorker`` and
``ActorWorker`` classes, built here instead of in worker processes), the in-memory data plane
(``relax.runtime.data.memory_plane``) instead of TransferQueue, and the advantages deployment's body
(``AdvantagesCore``) called by the actor rank as it calls Serve. Each worker sits behind a
``LocalHandle`` (``relax.runtime.session.local_handles``): the driver's Ray calls become calls in this
process, run in the order the Ray actors would run them, so the run gives the Ray path's numbers.
No Ray, TransferQueue or Serve process is started: the start-up is the workers' construction.

Only one rollout worker and one actor rank on CPU, in the synchronous schedule, without a critic or
reward services: ``relax.runtime.checks.in_process_rules`` refuses anything else before the run starts.
"""

from __future__ import annotations

import time

from relax.backends.registry import get_backend
from relax.runtime.checks import roles as R
from relax.runtime.files.console import log
from relax.runtime.session.local_handles import InProcessAdvantages, LocalHandle, LocalQueue
from relax.runtime.step.placement import placement_line


class LocalRuntime:
    """The live roles of one ``--in-process`` run (the attributes ``Runtime`` gives the driver)."""

    def __init__(self, config, algorithm_cls, layout: R.RoleLayout):
        self.config, self.algorithm_cls, self.layout = config, algorithm_cls, layout
        self.backend_cls = get_backend(config.backend)
        self.data_plane = None
        self.rollouts: list = []
        self.actors: list = []
        self.critic = None  # refused (in_process_rules): a critic needs its own worker
        self.startup_times: dict[str, float] = {}
        self.calls = LocalQueue()

    def start(self) -> None:
        from relax.runtime.data.memory_plane import MemoryDataPlane
        from relax.runtime.step.actor_worker import ActorWorker
        from relax.runtime.step.advantages import AdvantagesCore
        from relax.runtime.step.rollout_worker import RolloutWorker
        from relax.runtime.weights.weight_sync import make_weight_sync

        cfg, spec = self.config, self.config.advantage_estimator
        t0 = time.perf_counter()
        self.data_plane = MemoryDataPlane()
        on_actor = self.layout.placement[R.ADVANTAGES] == R.ON_ACTOR
        # The rollout worker first, then the actor (which seeds torch's generator for its model).
        weight_sync = make_weight_sync(cfg)  # the run's weight transport, handed to both ends
        rollout = RolloutWorker(cfg, spec, 0, weight_sync=weight_sync)
        rollout.data_plane = self.data_plane
        self.startup_times["rollout0_init_s"] = time.perf_counter() - t0
        actor = ActorWorker(cfg, spec, 0, 1, with_reference=R.REFERENCE in self.layout,
                            advantages_on_actor=on_actor, data_plane=self.data_plane,
                            with_teacher=R.TEACHER in self.layout, weight_sync=weight_sync)
        self.startup_times["actor0_init_s"] = time.perf_counter() - t0
        if not on_actor:
            actor.set_advantages_service(InProcessAdvantages(AdvantagesCore(spec, cfg.algorithm, self.data_plane)))
        self.rollouts = [LocalHandle(rollout, self.calls)]
        self.actors = [LocalHandle(actor, self.calls)]
        self.startup_times["workers_ready_s"] = time.perf_counter() - t0
        log("relax: in-process: 1 rollout worker and 1 actor rank in this process (no Ray, TransferQueue or Serve)")
        log(placement_line(["rollout0", "actor0"], [rollout.device(), actor.device()]))

    def stop(self) -> None:
        """Nothing runs outside this process: drop the calls not run (an interrupted run's) and the data."""
        self.calls = LocalQueue()
        if self.data_plane is not None:
            self.data_plane.clear_steps()
