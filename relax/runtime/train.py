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
from relax.config.output_dir import output_dir_of
from relax.runtime import roles as R
from relax.runtime.checkpoints import (
    check_checkpoint,
    read_checkpoint,
    restore_checkpoint,
    save_checkpoint,
)
from relax.runtime.cluster import Runtime
from relax.runtime.console import log
from relax.runtime.entry import entry_config
from relax.runtime.evaluation import Evaluation
from relax.runtime.local_runtime import LocalRuntime
from relax.runtime.metrics import MetricsLog, progress_line, summary_table
from relax.runtime.pipeline import Pipeline
from relax.runtime.preflight import preflight_once, was_checked
from relax.runtime.run_dir import lock_run_dir, run_of_checkpoint
from relax.runtime.run_errors import nothing_trained, skipped_step_warning
from relax.runtime.trackers import Trackers
from relax.runtime.user_errors import report as report_failure
from relax.runtime.validation import validate


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
    # The first and the last evaluation (relax.runtime.evaluation): their eval/* metrics, or None
    # without evaluation; e.g. eval_before["eval/correct/mean"] -> eval_after["eval/correct/mean"].
    eval_before: dict | None = None
    eval_after: dict | None = None


def saves_at(config, step: int) -> bool:
    """Whether a checkpoint is written after ``step``: the final step always (a run keeps its
    model), and every ``--save-interval`` steps."""
    return step == config.num_rollout or (bool(config.save_interval) and step % config.save_interval == 0)


# How long Ctrl-C / SIGTERM waits for the steps in flight to finish and the model to be saved.
INTERRUPT_SAVE_TIMEOUT_S = 60.0


def _save_on_interrupt(runtime, pipeline, metrics_log, trackers, out, steps_run: int, saved_step, bar):
    """Ctrl-C or SIGTERM once a step has trained: finish the steps already submitted (their rollouts
    have drawn prompts, so the saved state must include them), log them, then save — all within
    ``INTERRUPT_SAVE_TIMEOUT_S``. Says where the model went, or why it was not saved."""
    if pipeline is None or steps_run == 0:
        log("relax: no step finished training, so no model was saved", bar)
        return None
    deadline = time.monotonic() + INTERRUPT_SAVE_TIMEOUT_S
    step = None
    try:
        for t in sorted(pipeline.submitted):
            row = pipeline.step(t, submit_through=t, timeout=max(1.0, deadline - time.monotonic()))
            metrics_log.write(row)
            trackers.log(row)
        step = pipeline.last_submitted
        if step == saved_step:
            log(f"relax: the model of step {step} was already saved (resume with --load {out})", bar)
            return None
        log(f"relax: saving the model of step {step} (at most {INTERRUPT_SAVE_TIMEOUT_S:.0f}s; interrupt again "
            "to skip)", bar)
        path = save_checkpoint(runtime, out, step, timeout=max(1.0, deadline - time.monotonic()))
        log(f"relax: saved step {step} to {path.parent} (resume with --load {out})", bar)
        return path
    except KeyboardInterrupt:
        reason = "interrupted again"
    except Exception as exc:  # noqa: BLE001 - a dead worker, a timeout, a full disk: say it and shut down
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'no details'}"
    last = f"the last checkpoint is step {saved_step}" if saved_step else "no checkpoint was written"
    what = f"step {step}" if step is not None else "the steps in flight"
    log(f"relax: the model was not saved ({what}: {reason}); {last}", bar)
    return None


def submit_limit(config, step: int) -> int:
    """The last step whose rollout may be submitted while ``step`` is collected: up to the staleness
    bound ahead (one step ahead in the synchronous schedule), never past the run's end nor past a
    checkpoint that is not written yet."""
    limit = min(step + 1 + config.staleness_bound, config.num_rollout)
    return next((t for t in range(step, limit + 1) if saves_at(config, t)), limit)


def _short(key: str) -> str:
    return key[:4]


def run(config) -> RunSummary:
    """Train with ``config`` (a ``RunConfig``); returns a ``RunSummary``. A mistake raises
    ``ConfigError`` (``PreflightError`` for what the configuration points at) before anything starts;
    an argument that is not a ``RunConfig`` raises ``TypeError``."""
    t_start = time.perf_counter()
    config = entry_config(config)  # the type, and the defaults `relax train` derives (relax.runtime.entry)
    torch.set_num_threads(1)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # `relax train` is a console script: make the cwd importable
    algorithm_cls = load_algorithm(config.advantage_estimator)
    # The CLI's rules and pre-flight for every entry point: a RunConfig built in Python is refused as
    # `relax train` would refuse it (ConfigError), before Ray starts. `relax train` has run both on this
    # configuration already and printed their warnings (relax.runtime.preflight.was_checked).
    checked = was_checked(config)
    warnings = validate(config, algorithm_cls) + preflight_once(config, algorithm_cls)
    for warning in [] if checked else warnings:
        log(f"relax: warning: {warning}")
    layout = R.derive_roles(algorithm_cls, config)
    out = output_dir_of(config)
    # Refuse another run's directory (unless resuming or --overwrite-output-dir) and hold its lock while
    # this function runs (re-entrant: `relax train` already holds it); relax.runtime.run_dir.
    run_dir_lock = lock_run_dir(out, resuming=config.load or False, overwrite=config.overwrite_output_dir)  # noqa: F841
    keys = tuple(config.algorithm.reward_keys)

    state, start_step = None, 0
    if config.load:
        ckpt, state = read_checkpoint(config.load)  # an unreadable or incomplete file: CheckpointError
        for warning in check_checkpoint(config, state, config.load, has_critic=R.CRITIC in layout):
            log(f"relax: warning: {warning}")  # hyper-parameters changed on resume (allowed)
        start_step = int(state["step"])
        owner = run_of_checkpoint(config.load)  # the run directory the checkpoint belongs to, if any
        old_metrics = owner / "metrics.jsonl" if owner is not None else None
        new_metrics = out / "metrics.jsonl"
        if old_metrics is not None and old_metrics.exists() and old_metrics.resolve() != new_metrics.resolve():
            new_metrics.write_bytes(old_metrics.read_bytes())
    metrics_log = MetricsLog(out / "metrics.jsonl", resume_after_step=start_step if state else None,
                             warn=lambda message: log(f"relax: warning: {message}"))
    trackers = Trackers(config, out, resume_after_step=start_step if state else None)  # TensorBoard, W&B

    # --in-process places no role on Ray: the banner says where they really run
    roles = f"{', '.join(layout.roles)} (in this process)" if config.in_process else layout.describe()
    log(f"relax: {config.advantage_estimator} ({algorithm_cls.__module__}.{algorithm_cls.__qualname__}); "
         f"roles: {roles}; output: {out}")
    # the base rates of the task's own prompts: not news for a run on a data file or a user's environment
    if not (config.hf_checkpoint or config.prompt_data or config.env_path) and state is None:
        with contextlib.suppress(Exception):
            from relax.models.tiny.calculator import TASK_CHECKPOINTS
            from relax.models.tiny.weights import warmup_base_rates

            rates = warmup_base_rates(TASK_CHECKPOINTS.get(config.task))  # the task's own tiny model
            log("relax: warm-up base rates: " + ", ".join(f"{k} {v:.3f}" for k, v in rates.items()))

    # --in-process: the same roles in this process, without Ray (relax.runtime.local_runtime)
    runtime = (LocalRuntime if config.in_process else Runtime)(config, algorithm_cls, layout)
    last_ckpt = None
    saved_step = None
    pipeline = None
    bar = None
    steps_run = 0
    steps_skipped = 0  # steps whose every prompt group was dropped (nothing trained)
    step = None  # the step being collected: a failure names it
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
        evaluation = Evaluation(config, runtime)  # --eval-*: docs/en/evaluation.md
        if state is not None:
            evaluation.resume(metrics_log.rows)  # the original run's held-out "before"
        if evaluation.before_training(resuming=state is not None):
            row = {"step": start_step, **evaluation.run(start_step)}  # step 0: the initial policy
            metrics_log.write(row)
            trackers.log(row)
            log(evaluation.line(row), bar)
        for index in bar:
            step = index + 1
            final = step == config.num_rollout
            saving = saves_at(config, step)
            row = pipeline.step(step, submit_through=submit_limit(config, step))
            if evaluation.due(step):  # version `step`: the weights this step trained
                row.update(evaluation.run(step, pipeline.latest_weights))
                log(evaluation.line(row), bar)
            metrics_log.write(row)
            trackers.log(row)
            steps_run += 1
            if row.get("train/skipped"):
                steps_skipped += 1
                log(skipped_step_warning(config, row), bar)
            shown = (config.reward_key,) if config.reward_key else keys  # --reward-key: the run's reward
            postfix = {_short(k): f"{row.get(f'reward/{k}/mean', float('nan')):.2f}" for k in shown}
            if config.fully_async:
                postfix["stale"] = f"{row.get('async/staleness_max', 0):.0f}"
            bar.set_postfix(postfix, refresh=False)
            if not config.progress and (step % config.log_interval == 0 or final):
                log(progress_line(row, keys, config.num_rollout, config.reward_key))
            if saving:
                last_ckpt = save_checkpoint(runtime, out, step)
                saved_step = step
                pipeline.checkpointed(step)
        pipeline.close()
        bar.close()
        t_end = time.perf_counter()
        trained_rows = [r for r in metrics_log.rows if r["step"] > 0]  # not the evaluation before training
        table, stats = summary_table(trained_rows, keys, config.reward_key)
        log("\n" + table)
        log(f"relax: {steps_run} steps in {t_end - t_ready:.1f}s ({(t_end - t_ready) / max(steps_run, 1):.3f}s/step), "
             f"start-up {t_ready - t_start:.1f}s; metrics: {out / 'metrics.jsonl'}; model: {last_ckpt.parent if last_ckpt else 'not saved'}")
        eval_line = evaluation.summary_line()  # the held-out score before -> after, last
        if eval_line:
            log(eval_line)
        eval_before, eval_after = evaluation.before_after()
        if steps_run and steps_skipped == steps_run:
            raise nothing_trained(config, steps_run)  # exit 1 after the run's summary: it changed nothing
        return RunSummary(
            output_dir=str(out), steps_run=steps_run, last_step=start_step + steps_run, reward_first_last=stats,
            startup_s=t_ready - t_start, train_s=t_end - t_ready, total_s=t_end - t_start,
            metrics_path=str(out / "metrics.jsonl"), checkpoint=str(last_ckpt) if last_ckpt else None,
            eval_before=eval_before, eval_after=eval_after,
        )
    except KeyboardInterrupt:
        log("relax: interrupted; shutting down the workers", bar)
        # the workers are still alive here: save before runtime.stop() (bounded)
        _save_on_interrupt(runtime, pipeline, metrics_log, trackers, out, steps_run, saved_step, bar)
        raise
    except Exception as exc:
        report_failure(exc, out, step)  # <out>/error.log; the user's frames for `relax train`'s error line
        raise
    finally:
        trackers.close()
        if bar is not None:
            bar.close()
        runtime.stop()
