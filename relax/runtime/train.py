"""``run(config)``: the training driver behind ``relax train``.

It loads the algorithm class, derives the roles the run needs, starts them (``relax.runtime.cluster``),
optionally restores a checkpoint, and runs ``num_rollout`` synchronous steps through the step
pipeline (``relax.runtime.pipeline``): rollout -> [reference KL / critic values] -> advantages ->
actor (+ critic) training -> new weights to the rollout. The driver only moves small control
messages; batches go through the TransferQueue data plane and the new weights go from actor rank 0
to the rollout as a Ray object reference (never through the driver).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

import attrs
import torch

from relax.algorithms import load_algorithm
from relax.backends.registry import check_config as check_backend_config
from relax.runtime import roles as R
from relax.runtime.checkpoints import (
    check_checkpoint,
    read_checkpoint,
    restore_checkpoint,
    save_checkpoint,
)
from relax.runtime.cluster import Runtime, log
from relax.runtime.config import output_dir_of
from relax.runtime.metrics import MetricsLog, progress_line, summary_table
from relax.runtime.pipeline import Pipeline
from relax.runtime.run_dir import lock_run_dir
from relax.runtime.trackers import Trackers


@attrs.frozen
class RunSummary:
    output_dir: str
    steps_run: int
    last_step: int
    reward_first_last: dict  # component -> (mean over first 10% of steps, mean over last 10%)
    startup_s: float
    train_s: float
    total_s: float
    metrics_path: str
    checkpoint: str | None


def saves_at(config, step: int) -> bool:
    """Whether a checkpoint is written after ``step``. The final step is saved whenever checkpoints
    are on, and always with --hf-checkpoint (the trained model in Hugging Face format is the point
    of such a run)."""
    final = step == config.num_rollout
    return (bool(config.save_interval) and (step % config.save_interval == 0 or final)) or (
        bool(config.hf_checkpoint) and final
    )


def submit_limit(config, step: int) -> int:
    """The last step whose rollout may be submitted while ``step`` is collected: up to the staleness
    bound ahead (one step ahead in the synchronous schedule), never past the run's end nor past a
    checkpoint that is not written yet."""
    limit = min(step + 1 + config.staleness_bound, config.num_rollout)
    return next((t for t in range(step, limit + 1) if saves_at(config, t)), limit)


def _short(key: str) -> str:
    return key[:4]


def run(config) -> RunSummary:
    """Train with ``config`` (a ``RunConfig``); returns a ``RunSummary``."""
    t_start = time.perf_counter()
    torch.set_num_threads(1)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # `relax train` is a console script: make the cwd importable
    algorithm_cls = load_algorithm(config.advantage_estimator)
    layout = R.derive_roles(algorithm_cls, config)
    check_backend_config(config)  # e.g. Megatron's parallel layout, before any worker starts
    out = output_dir_of(config)
    # Refuse another run's directory (unless resuming or --overwrite-output-dir) and hold its lock while
    # this function runs (re-entrant: `relax train` already holds it); relax.runtime.run_dir.
    run_dir_lock = lock_run_dir(out, resuming=bool(config.load), overwrite=config.overwrite_output_dir)  # noqa: F841
    keys = tuple(config.algorithm.reward_keys)

    state, start_step = None, 0
    if config.load:
        ckpt, state = read_checkpoint(config.load)  # an unreadable or incomplete file: CheckpointError
        check_checkpoint(config, state, config.load, has_critic=R.CRITIC in layout)
        start_step = int(state["step"])
        old_metrics = ckpt.parents[2] / "metrics.jsonl"
        new_metrics = out / "metrics.jsonl"
        if old_metrics.exists() and old_metrics.resolve() != new_metrics.resolve():
            new_metrics.write_text(old_metrics.read_text())
    metrics_log = MetricsLog(out / "metrics.jsonl", resume_after_step=start_step if state else None)
    trackers = Trackers(config, out, resume_after_step=start_step if state else None)  # TensorBoard, W&B

    log(f"relax: {config.advantage_estimator} ({algorithm_cls.__module__}.{algorithm_cls.__qualname__}); "
         f"roles: {layout.describe()}; output: {out}")
    if not config.hf_checkpoint and state is None:
        with contextlib.suppress(Exception):
            from relax.models.tiny.weights import warmup_base_rates

            rates = warmup_base_rates()
            log("relax: warm-up base rates: " + ", ".join(f"{k} {v:.3f}" for k, v in rates.items()))

    runtime = Runtime(config, algorithm_cls, layout)
    last_ckpt = None
    bar = None
    steps_run = 0
    try:
        runtime.start()
        if state is not None:
            restore_checkpoint(runtime, state)
            log(f"relax: resumed from step {start_step} ({config.load})")
        t_ready = time.perf_counter()
        log(f"relax: start-up {t_ready - t_start:.1f}s (" + ", ".join(
            f"{k} {v:.1f}" for k, v in runtime.startup_times.items()) + ")")
        from tqdm import tqdm

        bar = tqdm(
            range(start_step, config.num_rollout), desc="train", unit="step", disable=not config.progress,
            initial=start_step, total=config.num_rollout, file=sys.stderr, dynamic_ncols=True,
        )
        pipeline = Pipeline(runtime, start_step)
        for index in bar:
            step = index + 1
            final = step == config.num_rollout
            saving = saves_at(config, step)
            row = pipeline.step(step, submit_through=submit_limit(config, step))
            metrics_log.write(row)
            trackers.log(row)
            steps_run += 1
            postfix = {_short(k): f"{row.get(f'reward/{k}/mean', float('nan')):.2f}" for k in keys}
            if config.fully_async:
                postfix["stale"] = f"{row.get('async/staleness_max', 0):.0f}"
            bar.set_postfix(postfix, refresh=False)
            if not config.progress and (step % config.log_interval == 0 or final):
                log(progress_line(row, keys, config.num_rollout))
            if saving:
                last_ckpt = save_checkpoint(runtime, out, step)
                pipeline.checkpointed(step)
        pipeline.close()
        bar.close()
        t_end = time.perf_counter()
        table, stats = summary_table(metrics_log.rows, keys)
        log("\n" + table)
        log(f"relax: {steps_run} steps in {t_end - t_ready:.1f}s ({(t_end - t_ready) / max(steps_run, 1):.3f}s/step), "
             f"start-up {t_ready - t_start:.1f}s; metrics: {out / 'metrics.jsonl'}")
        return RunSummary(
            output_dir=str(out), steps_run=steps_run, last_step=start_step + steps_run, reward_first_last=stats,
            startup_s=t_ready - t_start, train_s=t_end - t_ready, total_s=t_end - t_start,
            metrics_path=str(out / "metrics.jsonl"), checkpoint=str(last_ckpt) if last_ckpt else None,
        )
    except KeyboardInterrupt:
        log("relax: interrupted; shutting down the workers", bar)
        raise
    finally:
        trackers.close()
        if bar is not None:
            bar.close()
        runtime.stop()
