"""``relax train`` in the calling process, from Python: the single-process recipe.

``train_single_process(config)`` is ``relax.runtime.driver.train.run`` with ``--in-process``
(``relax.runtime.cluster.local_runtime``): the run's one rollout worker and one actor rank are built in
this process over the in-memory data plane, and the driver's own loop runs them. There is no second loop:
the step, its metrics (the names of ``docs/en/tracking.md``), the evaluation, the checkpoints and the
run directory are ``relax train``'s, and the numbers equal a Ray run's with the same configuration
bit for bit (``tests/runtime/test_in_process.py``, ``tests/recipes/test_single_process.py``).

What this adds is the result as Python values: every row of ``metrics.jsonl`` and the final policy
weights, for scripts that compare runs (``examples/gdpo/compare.py``, ``benchmarks/in_process.py``)
and for stepping through a method with a debugger or a profiler.

    from relax.recipes.single_process import train_single_process
    result = train_single_process(config)        # config: a RunConfig, as `relax train` builds it
    result.rows[-1]["reward/correct/mean"], result.weights

What needs Ray (several workers, ``--fully-async``, a critic, the reward services, ...) is refused
before anything starts with a ``ConfigError`` (a ``ValueError``) naming the flag
(``relax.runtime.checks.in_process_rules``).
"""

from __future__ import annotations

import time

import attrs
import torch

from relax.models.checkpoint_paths import policy_weights
from relax.runtime.driver.train import RunSummary, run
from relax.runtime.files.checkpoint_files import read_checkpoint
from relax.runtime.files.metrics_log import read_metrics


@attrs.frozen
class SingleProcessResult:
    rows: list[dict]  # metrics.jsonl: one row per step (and step 0's evaluation before training, if any)
    weights: dict[str, torch.Tensor]  # the policy after the last step, as its checkpoint holds it
    seconds: float  # the whole call: start-up, training, evaluation and the final checkpoint
    summary: RunSummary  # what run() returned: output directory, timings, evaluations, checkpoint


def train_single_process(config) -> SingleProcessResult:
    """Train ``config`` (a ``RunConfig``) with ``relax train``'s driver and its roles in this process."""
    t0, threads = time.perf_counter(), torch.get_num_threads()
    try:
        summary = run(attrs.evolve(config, in_process=True))
    finally:
        torch.set_num_threads(threads)  # run() trains with one thread; the caller keeps its setting
    seconds = time.perf_counter() - t0
    rows, _ = read_metrics(summary.metrics_path)  # written by this run: no partial line to warn about
    _, state = read_checkpoint(summary.checkpoint)  # the final step is always saved (saves_at)
    return SingleProcessResult(rows=rows, weights=dict(policy_weights(state)), seconds=seconds,
                               summary=summary)
