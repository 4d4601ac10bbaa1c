"""The step pipeline: the driver submits whole steps as chains of Ray calls and collects their
results into one metrics row per step.

A step is a chain of Ray calls linked by object references: rollout workers -> [critic values,
reference KL] -> actor ranks (+ critic training). Each worker receives the rollout reports and
derives the same mini-batch plan from them; actor rank 0 sends the advantages request to the Serve
deployment itself and computes the old log-probs while the deployment works. The driver never sits
between two roles.

**Policy versions and staleness.** Version ``v`` is the policy after training step ``v`` (the start
of the run, or the checkpoint it resumed from, is version ``start``). The rollout of step ``t``
samples with version ``max(t - 1 - K, floor)``: it is submitted with that version's weights
reference and training results as arguments, so Ray starts it the moment that version exists. With
K = 0 (the synchronous schedule) that is version ``t - 1``; with ``--fully-async --max-staleness K``
rollouts run up to K versions ahead and overlap training, and no trained sample is ever more than K
versions old: the rollout waits instead of running further ahead, so nothing is dropped.
``floor`` is the newest checkpointed version: no rollout is submitted past a checkpoint before it is
written (the rollout state saved must be the one after that step), and the rollouts after it
sample with the checkpointed weights or newer, so a run resumed from there repeats the same schedule.
"""

from __future__ import annotations

import time

from relax.config.steps import num_minibatches
from relax.runtime.checks import roles as R
from relax.runtime.cluster.cluster import Runtime
from relax.runtime.metrics.actor_metrics import STEP_METRICS_KEY, combine_actor_metrics, logged_name
from relax.runtime.session.held_signals import signals_held
from relax.runtime.session.waits import BackgroundCall, Patience, get
from relax.runtime.step.rollouts import plan_from_rollouts, rollout_metrics


def rollout_version(step: int, staleness_bound: int, floor: int) -> int:
    """The policy version the rollout of ``step`` samples with (see the module docstring)."""
    return max(step - 1 - staleness_bound, floor)


class Pipeline:
    def __init__(self, rt: Runtime, start_step: int = 0):
        self.rt = rt
        self.k = rt.config.staleness_bound
        self.algorithm = rt.algorithm_cls(rt.config.algorithm)  # for the rollout metrics
        self.floor = start_step
        # version -> (reference to its weights (None: the rollout keeps its own), its training results)
        self.versions: dict[int, tuple] = {start_step: (None, [])}
        self.submitted: dict[int, dict] = {}
        # step -> its metrics row, from the moment its results are in until the driver has logged it
        # (``logged``): an interrupt in between leaves the row here for the interrupt path to log
        self.collected: dict[int, dict] = {}
        self.last_submitted = start_step
        # A reference to the newest collected policy's weights, for the evaluation (None: the run's
        # initial or restored weights, which the rollout engines hold); a skipped step keeps the last.
        self.latest_weights = None
        self.t_last = time.perf_counter()
        # Dropping a finished step's partition is off the critical path: a driver thread does it
        # while the next steps run (TransferQueue's client is thread-safe: it runs its own loop).
        self.clearer = BackgroundCall("clearing a finished step from the data plane")
        self.patience = Patience(rt.config.worker_timeout)  # a step without progress ends the run

    def checkpointed(self, step: int) -> None:
        """A checkpoint of ``step`` was written: later rollouts sample with its weights or newer."""
        self.floor = step

    def _submit(self, step: int) -> None:
        rt, cfg, layout = self.rt, self.rt.config, self.rt.layout
        version = rollout_version(step, self.k, self.floor)
        weights, after = self.versions[version]
        # Two return values per rollout worker: the step's shape (kept groups and their token counts:
        # all the training roles need to plan) and the whole report (rewards, texts: the driver's).
        outs = [w.rollout.options(num_returns=2).remote(step, version, weights, *after) for w in rt.rollouts]
        shapes, rolls = [o[0] for o in outs], [o[1] for o in outs]
        with_values = rt.critic is not None
        with_kl = R.REFERENCE in layout and cfg.algorithm.kl_in_reward
        on_actor = layout.placement[R.ADVANTAGES] == R.ON_ACTOR
        prep = []
        if with_kl and not on_actor:
            prep += [a.prepare_step.remote(step, *shapes) for a in rt.actors]
        if with_values:
            prep.append(rt.critic.values_step.remote(step, *shapes))
        # No dependency on `prep`: every read of values / KL (the deployment's, or the actor's own
        # with advantages on the actor) waits in the data plane until they are written, so the old
        # log-probs are computed while the critic works.
        outs = [a.train_step.options(num_returns=2).remote(step, with_values, with_kl, *shapes) for a in rt.actors]
        critic = [rt.critic.train_step.remote(step, *shapes)] if with_values else []
        train = [o[0] for o in outs] + critic
        self.submitted[step] = {"rolls": rolls, "prep": prep, "train": train, "version": version,
                                "weights": outs[0][1]}
        self.versions[step] = (outs[0][1], train)
        self.last_submitted = step
        oldest_needed = max(step - self.k, self.floor)  # no later step samples with an older version
        for v in [v for v in self.versions if v < oldest_needed]:
            del self.versions[v]

    def _clear_later(self, step: int) -> None:
        self.clearer.submit(self.rt.data_plane.clear, step)  # after the previous clear; its error surfaces here

    def step(self, step: int, submit_through: int, timeout: float | None = None) -> dict:
        """Collect ``step``'s results, after submitting every step up to ``submit_through`` (the
        caller never asks past a checkpoint that has not been written yet). ``step`` stays in
        ``submitted`` until its results are in, so an interrupted collection can be finished; then its
        row stays in ``collected`` until the caller has logged it (``logged``)."""
        for t in range(self.last_submitted + 1, max(step, submit_through) + 1):
            self._submit(t)
        refs = self.submitted[step]
        progress = self.patience.deadline()
        rolls = get(refs["rolls"], "rollout", timeout=timeout, progress=progress)
        t_roll = time.perf_counter()
        row = {"step": step, **rollout_metrics(self.algorithm, rolls)}
        for part in get(refs["prep"], "reference/critic", timeout=timeout, progress=progress):
            row.update(part)
        results = get(refs["train"], "actor/critic", timeout=timeout, progress=progress)
        now = time.perf_counter()
        # Each actor rank reports its shares of the loss metrics per optimizer step: sum them over
        # the data-parallel ranks (relax.runtime.metrics.actor_metrics). Other keys: rank 0's win.
        # (The results are read, not changed: an interrupted collection reads them again.)
        shares = [part.get(STEP_METRICS_KEY) for part in results[: len(self.rt.actors)]]
        for part in reversed(results):
            row.update({k: v for k, v in part.items() if k != STEP_METRICS_KEY})
        combined = combine_actor_metrics([steps for steps in shares if steps is not None])
        row.update({logged_name(k): v for k, v in combined.items()})
        plan = plan_from_rollouts(rolls, num_minibatches(self.rt.config), len(self.rt.actors))
        if plan.num_groups == 0:
            row["train/skipped"] = 1  # every group was dropped: nothing trained, weights unchanged
        else:
            self.latest_weights = refs["weights"]
        step_s = now - self.t_last
        self.patience.observe(step_s)
        row.update({
            "time/rollout_s": row["time/rollout/total_s"],
            "time/advantages_s": row.get("time/advantages/total_s", 0.0),
            "time/train_s": now - t_roll,  # from the rollout's result to the last training result
            "time/step_s": step_s,
            "perf/samples_per_s": plan.num_groups * plan.group_size / step_s,
            "perf/tokens_per_s": row["rollout/generated_tokens"] / step_s,
            # prompt and response tokens trained over the training phase (old log-probs, optimizer
            # steps and the weight publish): what benchmarks/gpu.py turns into MFU
            "perf/train_tokens_per_s": sum(r.get("trained_tokens", 0) for r in rolls) / max(now - t_roll, 1e-9),
        })
        if self.rt.config.fully_async:
            row["async/policy_version"] = refs["version"]
        self.t_last = now
        with signals_held():  # the step is in exactly one of the two, whenever Ctrl-C comes
            self.collected[step] = row
            del self.submitted[step]
        self._clear_later(step)  # every consumer of this step is done (waits for the previous clear)
        return row

    def logged(self, step: int) -> None:
        """The driver has written ``step``'s row to the metrics log."""
        del self.collected[step]

    def close(self) -> None:
        self.clearer.wait()
