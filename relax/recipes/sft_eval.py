"""``relax sft``'s held-out evaluation: ``relax train``'s own, in this process.

The same prompts (``--eval-prompt-data``, else the built-in task's held-out problems), sampling
(``--eval-temperature`` ...), reward function and ``eval/*`` metrics as ``relax train``'s evaluation
(``relax.runtime.driver.evaluation``): the trained weights go to one rollout engine through the same weight
route, and ``sample_eval_slice`` samples and scores them as a single rollout worker would.
"""

from __future__ import annotations

import time

from relax.rollout import factory as rollout_factory
from relax.rollout.environments import episode_runner
from relax.runtime.driver.evaluation import Evaluation, eval_metrics
from relax.runtime.step.eval_sampling import sample_eval_slice
from relax.runtime.weights.weight_sync import WeightSync


class SftEvaluation:
    """One rollout engine, the reward function and the evaluation prompts, plus ``Evaluation``'s
    schedule (``due``), line and before/after summary."""

    index, num_workers = 0, 1  # sample_eval_slice's share: all the prompts

    def __init__(self, config, weight_sync: WeightSync):
        """``weight_sync``: the route from the trained weights to the engine (the engine lives in this
        process, so ``relax sft`` hands in the object store's)."""
        self.config = config
        self.schedule = Evaluation(config, runtime=None)  # only its bookkeeping: no Ray handles are used
        self.engine = rollout_factory.build_engine(config) if self.schedule.enabled else None
        self.tokenizer = self.engine.tokenizer if self.engine is not None else None
        self.reward_fn, self.reward_keys = rollout_factory.reward_setup(config)
        self.episodes = episode_runner(config)
        self.sync = weight_sync
        self._prompts: list | None = None

    @property
    def enabled(self) -> bool:
        return self.schedule.enabled

    def eval_prompts(self) -> list:
        if self._prompts is None:
            self._prompts = rollout_factory.build_eval_prompts(self.config, self.tokenizer)
        return self._prompts

    def run(self, step: int, weights) -> dict:
        """The ``eval/*`` metrics of the weights after ``step`` (``weights``: the backend's export)."""
        t0 = time.perf_counter()
        self.sync.receive(self.sync.publish(weights), self.engine)
        metrics = eval_metrics(self.config, [sample_eval_slice(self, step)], step)
        metrics["time/eval_s"] = time.perf_counter() - t0
        self.schedule.results[step] = {k: v for k, v in metrics.items() if k.startswith("eval/")}
        return metrics
