"""The synchronous step pipeline: the driver submits whole steps as chains of Ray calls and
collects their results into one metrics row per step.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from relax.runtime import roles as R
from relax.runtime.actor_metrics import STEP_METRICS_KEY, combine_actor_metrics
from relax.runtime.cluster import Runtime, get
from relax.runtime.schedule import num_minibatches, plan_from_rollout


class Pipeline:
    """Submits whole steps and collects their results; the driver never sits between two roles.

    A step is a chain of Ray calls linked by object references: rollout -> [critic values,
    reference KL] -> actor ranks (+ critic training). Each worker receives the rollout's result
    and derives the same mini-batch plan from it; actor rank 0 sends the advantages request to the
    Serve deployment itself and computes the old log-probs while the deployment works. The next
    step's rollout is submitted before this step's results are awaited, with the new-weights
    reference and this step's training results as arguments, so Ray starts it the moment training
    ends. (Not across a checkpoint: the rollout state saved must be the one after this step.)
    """

    def __init__(self, rt: Runtime):
        self.rt = rt
        self.submitted: dict[int, dict] = {}
        self.weights = None  # reference to the newest weights (None: the rollout keeps its own)
        self.after: list = []  # the previous step's training results
        self.t_last = time.perf_counter()
        # Dropping a finished step's partition is off the critical path: a driver thread does it
        # while the next step runs (TransferQueue's client is thread-safe: it runs its own loop).
        self.clearer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="relax-clear")
        self.clearing = None

    def _submit(self, step: int) -> None:
        rt, cfg, layout = self.rt, self.rt.config, self.rt.layout
        roll = rt.rollout.step.remote(step, self.weights, *self.after)
        with_values = rt.critic is not None
        with_kl = R.REFERENCE in layout and cfg.algorithm.kl_in_reward
        on_actor = layout.placement[R.ADVANTAGES] == R.ON_ACTOR
        prep = []
        if with_kl and not on_actor:
            prep += [a.prepare_step.remote(step, roll) for a in rt.actors]
        if with_values:
            prep.append(rt.critic.values_step.remote(step, roll))
        # No dependency on `prep`: every read of values / KL (the deployment's, or the actor's own
        # with advantages on the actor) waits in the data plane until they are written, so the old
        # log-probs are computed while the critic works.
        outs = [a.train_step.options(num_returns=2).remote(step, roll, with_values, with_kl) for a in rt.actors]
        critic = [rt.critic.train_step.remote(step, roll)] if with_values else []
        train = [o[0] for o in outs] + critic
        new_weights = outs[0][1]
        self.submitted[step] = {"roll": roll, "prep": prep, "train": train, "t_submit": time.perf_counter()}
        self.weights, self.after = new_weights, train

    def _clear_later(self, step: int) -> None:
        if self.clearing is not None:
            self.clearing.result()  # surface an error of the previous clear here
        self.clearing = self.clearer.submit(self.rt.data_plane.clear, step)

    def step(self, step: int, prefetch_next: bool) -> dict:
        if step not in self.submitted:
            self._submit(step)
        if prefetch_next:
            self._submit(step + 1)
        refs = self.submitted.pop(step)
        roll = get(refs["roll"], "rollout")
        t_roll = time.perf_counter()
        row = {"step": step, **roll["metrics"]}
        for part in get(refs["prep"], "reference/critic"):
            row.update(part)
        results = get(refs["train"], "actor/critic")
        now = time.perf_counter()
        self._clear_later(step)  # every consumer of this step is done
        # Each actor rank reports its shares of the loss metrics per optimizer step: sum them over
        # the data-parallel ranks (relax.runtime.actor_metrics). Other keys: rank 0's win.
        shares = [part.pop(STEP_METRICS_KEY, None) for part in results[: len(self.rt.actors)]]
        for part in reversed(results):
            row.update(part)
        combined = combine_actor_metrics([steps for steps in shares if steps is not None])
        row.update({f"actor/{k}": v for k, v in combined.items()})
        plan = plan_from_rollout(roll, num_minibatches(self.rt.config), len(self.rt.actors))
        if plan.num_groups == 0:
            row["train/skipped"] = 1  # every group was dropped: nothing trained, weights unchanged
        row.update({
            "time/rollout_s": roll["metrics"]["time/rollout/total_s"],
            "time/advantages_s": row.get("time/advantages/total_s", 0.0),
            "time/train_s": now - t_roll,  # from the rollout's result to the last training result
            "time/step_s": now - self.t_last,
        })
        self.t_last = now
        return row

    def close(self) -> None:
        if self.clearing is not None:
            self.clearing.result()
        self.clearer.shutdown(wait=True)
