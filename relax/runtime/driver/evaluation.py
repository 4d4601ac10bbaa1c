"""Evaluation during training: the current policy on held-out prompts, with the rollout engines.

What is evaluated (``relax.rollout.factory.evaluation_source``): ``--eval-prompt-data``, else, in the
embedded default, the built-in task's held-out problems (disjoint from its training stream); never
with ``--no-eval``. When: before training (step 0, ``--no-eval-before-train`` skips it; never on
resume), after every ``--eval-interval`` steps and after the last step.

How (``Evaluation.run``): the driver sends the weights of policy version v (the policy after
training step v; the step's own weights reference, so asynchronous training evaluates exactly
version v too) to every rollout worker. Worker i takes its contiguous slice of the evaluation
prompts (``relax.runtime.step.eval_sampling.slice_bounds``), samples ``--eval-n-samples-per-prompt`` completions each with the
evaluation sampling parameters and its own generator (seeded from ``--seed``, the version and i,
never the training one) and scores them with the run's reward function; the driver merges the
slices in worker order. Evaluation draws nothing from the training prompt stream and no training
random number, so a run trains identically with and without it. Later rollouts always load their
own version's weights, so the weights an evaluation leaves in the engine are never sampled from.

Metrics (in the row of step v of ``metrics.jsonl``, hence the trackers): ``eval/<component>/mean``
over every sample, ``eval/pass@k`` for k = n (and ``eval/pass@1`` when n > 1; the unbiased
estimator ``pass_at_k`` averaged over prompts), ``eval/response_len``, ``eval/num_prompts``,
``eval/policy_version``. A sample *passes* when its pass component (``pass_component``) is at least
``--eval-pass-threshold``.
"""

from __future__ import annotations

import math
import time

import torch

from relax.runtime.metrics.step_metrics import EVAL_COMPLETIONS_KEY
from relax.runtime.session.waits import get
from relax.runtime.step.eval_sampling import CORRECT, pass_component


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of the chance that at least one of k samples passes, from n samples of
    which c pass: ``1 - C(n - c, k) / C(n, k)`` (Chen et al. 2021), exact in integers."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


# -- the driver: merge the slices, the metrics ---------------------------------------------------------


def eval_metrics(config, reports: list[dict], version: int) -> dict:
    """The ``eval/*`` metrics of one evaluation from the workers' reports (in worker order)."""
    keys = tuple(config.algorithm.reward_keys)
    n = config.eval_n_samples_per_prompt
    rewards = torch.cat([r["rewards"] for r in reports]).double()
    prompts = sum(r["prompts"] for r in reports)
    lengths = [x for r in reports for x in r["lengths"]]
    out: dict = {"eval/policy_version": int(version), "eval/num_prompts": prompts}
    if prompts == 0:
        return out
    for j, key in enumerate(keys):
        out[f"eval/{key}/mean"] = float(rewards[:, j].mean())
    passed = rewards[:, keys.index(pass_component(config))] >= config.eval_pass_threshold
    counts = passed.view(prompts, n).sum(1).tolist()
    for k in sorted({1, n}):
        out[f"eval/pass@{k}"] = sum(pass_at_k(n, int(c), k) for c in counts) / prompts
    out["eval/response_len"] = sum(lengths) / len(lengths)
    records = [x for r in reports for x in r["completions"]]
    if records:
        out[EVAL_COMPLETIONS_KEY] = records
    return out


def describe_eval_set(config, source: str, num_prompts: int) -> str:
    """How the summary names what was measured, e.g. ``held-out accuracy (correct, greedy, 20 problems)``."""
    sampling = "greedy" if config.eval_temperature == 0 else f"temperature {config.eval_temperature:g}"
    what = f"{num_prompts} problems" if source == "held-out" else f"{num_prompts} prompts of {config.eval_prompt_data}"
    component = pass_component(config)
    n = config.eval_n_samples_per_prompt
    full_marks = component == CORRECT and config.eval_pass_threshold == 1.0  # the built-in tasks' accuracy
    measure = component if full_marks else f"{component} >= {config.eval_pass_threshold:g}"
    name = "held-out accuracy" if source == "held-out" else "eval pass@1"
    return f"{name} ({measure}, {sampling}{f', {n} samples' if n > 1 else ''}, {what})"


class Evaluation:
    """The driver's side: when to evaluate, the Ray calls, and the before/after numbers."""

    def __init__(self, config, runtime):
        from relax.rollout.factory import evaluation_source

        self.config, self.runtime = config, runtime
        self.source = evaluation_source(config)
        self.results: dict[int, dict] = {}  # policy version -> its eval/* metrics

    @property
    def enabled(self) -> bool:
        return self.source is not None

    def before_training(self, resuming: bool) -> bool:
        return self.enabled and self.config.eval_before_train and not resuming

    def due(self, step: int) -> bool:
        interval = self.config.eval_interval
        return self.enabled and (step == self.config.num_rollout or bool(interval) and step % interval == 0)

    def run(self, version: int, weights=None, timeout: float | None = None) -> dict:
        """Evaluate policy version ``version`` (``weights``: a reference to its weights, None: the
        weights the rollout engines hold, i.e. the run's initial or restored ones)."""
        t0 = time.perf_counter()
        refs = [w.evaluate.remote(version, weights) for w in self.runtime.rollouts]
        metrics = eval_metrics(self.config, get(refs, "evaluation", timeout=timeout), version)
        metrics["time/eval_s"] = time.perf_counter() - t0
        self.results[version] = {k: v for k, v in metrics.items() if k.startswith("eval/")}
        return metrics

    def line(self, row: dict) -> str:
        """One line per evaluation: ``relax: eval step 0: correct 0.450 ... pass@1 0.450 | response len 4.2``."""
        keys = tuple(self.config.algorithm.reward_keys)
        parts = [f"{k} {row[f'eval/{k}/mean']:.3f}" for k in keys if f"eval/{k}/mean" in row]
        parts += [f"{name[5:]} {row[name]:.3f}" for name in sorted(row) if name.startswith("eval/pass@")]
        length = f" | response len {row['eval/response_len']:.1f}" if "eval/response_len" in row else ""
        return f"relax: eval step {row['eval/policy_version']} ({row['eval/num_prompts']} prompts): {' '.join(parts)}{length}"

    def resume(self, rows) -> None:
        """A resumed run keeps the evaluations its earlier part logged (``metrics.jsonl`` rows up to
        the checkpoint), so the summary still compares with the held-out score before training."""
        for row in rows:
            if "eval/policy_version" in row:
                metrics = {k: v for k, v in row.items() if k.startswith("eval/")}
                self.results[int(row["eval/policy_version"])] = metrics

    def before_after(self) -> tuple[dict | None, dict | None]:
        """The first and the last evaluation of the run (None when there was none)."""
        if not self.results:
            return None, None
        versions = sorted(self.results)
        return self.results[versions[0]], self.results[versions[-1]]

    def summary_line(self) -> str | None:
        """``held-out accuracy (correct, greedy, 20 problems): 0.45 -> 0.80 (step 0 -> step 450)``."""
        first, last = self.before_after()
        if first is None:
            return None
        label = describe_eval_set(self.config, self.source, int(last["eval/num_prompts"]))
        if first is last:
            return f"relax: {label}: {last.get('eval/pass@1', float('nan')):.2f} (step {last['eval/policy_version']})"
        return (f"relax: {label}: {first.get('eval/pass@1', float('nan')):.2f} -> "
                f"{last.get('eval/pass@1', float('nan')):.2f} (step {first['eval/policy_version']} -> "
                f"step {last['eval/policy_version']})")
