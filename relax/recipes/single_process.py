"""``relax train``'s synchronous step in one process, without Ray: the same roles, the same numbers.

The recipe composes the roles' plain-Python cores — ``RolloutCore`` (sample, score, filter,
normalize), ``AdvantagesCore`` (the Serve deployment's body) and ``ActorCore`` (old log-probs,
advantages, one optimizer step per mini-batch) — over the in-memory data plane, and assembles each
step's metrics row with the driver's own functions. With one rollout worker, one actor rank and the
synchronous schedule, ``train_single_process(config)`` and ``relax train`` give bit-identical
metrics (timings aside) and weights: the step is defined once, and a test holds the two together.

    from relax.recipes.single_process import train_single_process
    result = train_single_process(config)        # config: a RunConfig, as `relax train` builds it
    result.rows[-1]["reward/correct/mean"], result.weights

What it does not run: several workers, ``--fully-async``, a critic, evaluation, checkpoints and
trackers (those are the runtime's); asking for one raises ``ValueError`` naming the flag.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import attrs
import torch

from relax.algorithms import load_algorithm
from relax.config.run import num_minibatches
from relax.runtime import roles as R
from relax.runtime.actor_metrics import STEP_METRICS_KEY, combine_actor_metrics
from relax.runtime.actor_worker import ActorCore
from relax.runtime.advantages import AdvantagesCore
from relax.runtime.local_handles import InProcessAdvantages
from relax.runtime.memory_plane import MemoryDataPlane
from relax.runtime.rollout_worker import RolloutCore
from relax.runtime.rollouts import plan_from_rollouts, rollout_metrics
from relax.runtime.validation import validate


@attrs.frozen
class SingleProcessResult:
    rows: list[dict]  # one metrics row per step, the keys `relax train` writes to metrics.jsonl
    weights: dict[str, torch.Tensor]  # the policy after the last step (the backend's export)
    seconds: float


def _refusals(config, layout) -> list[str]:
    problems = []
    if config.rollout_num_workers != 1:
        problems.append(f"--rollout-num-workers {config.rollout_num_workers}: the single-process recipe has one")
    if config.actor_num_workers != 1:
        problems.append(f"--actor-num-workers {config.actor_num_workers}: the single-process recipe has one rank")
    if config.fully_async:
        problems.append("--fully-async: the single-process recipe runs the synchronous schedule")
    if R.CRITIC in layout:
        problems.append(f"--advantage-estimator {config.advantage_estimator} needs a critic, which only relax train runs")
    return problems


def train_single_process(config, on_step: Callable[[dict], None] | None = None) -> SingleProcessResult:
    """Train ``config.num_rollout`` synchronous steps in this process (see the module docstring)."""
    algorithm_cls = load_algorithm(config.advantage_estimator)
    validate(config, algorithm_cls)
    layout = R.derive_roles(algorithm_cls, config)
    problems = _refusals(config, layout)
    if problems:
        raise ValueError("; ".join(problems) + " (use relax train)")
    previous_threads = torch.get_num_threads()
    plane = MemoryDataPlane()
    spec = config.advantage_estimator
    try:
        rollout = RolloutCore(config, spec, plane)
        on_actor = layout.placement[R.ADVANTAGES] == R.ON_ACTOR
        actor = ActorCore(config, spec, with_reference=R.REFERENCE in layout, advantages_on_actor=on_actor,
                          data_plane=plane)
        if not on_actor:
            actor.advantages_service = InProcessAdvantages(AdvantagesCore(spec, config.algorithm, plane))
        with_kl = R.REFERENCE in layout and config.algorithm.kl_in_reward
        algorithm = algorithm_cls(config.algorithm)  # the driver's copy, for the rollout metrics
        minibatches = num_minibatches(config)
        rows, weights = [], None
        start = time.perf_counter()
        for step in range(1, config.num_rollout + 1):
            roll = rollout.step(step, step - 1, weights)
            row = {"step": step, **rollout_metrics(algorithm, [roll])}
            plan = plan_from_rollouts([roll], minibatches, 1)
            if plan.num_groups == 0:
                row["train/skipped"] = 1  # every group was dropped: weights unchanged
                weights = None
            else:
                if with_kl and not on_actor:
                    row.update(actor.prepare(step, plan))
                metrics, weights = actor.train(step, plan, with_values=False, with_kl=with_kl)
                shares = metrics.pop(STEP_METRICS_KEY, None)
                row.update(metrics)
                row.update({f"actor/{k}": v for k, v in combine_actor_metrics([shares]).items()})
            plane.clear(step)
            rows.append(row)
            if on_step is not None:
                on_step(row)
        final = actor.backend.export_weights()
        return SingleProcessResult(rows=rows, weights=dict(final), seconds=time.perf_counter() - start)
    finally:
        torch.set_num_threads(previous_threads)
