"""``run(config)``: the training driver behind ``relax train``.

It loads the algorithm class, derives the roles the run needs, starts them (``relax.runtime.cluster.cluster``),
optionally restores a checkpoint, and runs ``num_rollout`` synchronous steps through the step
pipeline (``relax.runtime.driver.pipeline``): rollout -> [reference KL / critic values] -> advantages ->
actor (+ critic) training -> new weights to the rollout. The driver only moves small control
messages; batches go through the TransferQueue data plane and the new weights go from actor rank 0
to the rollout as a Ray object reference (never through the driver).

``run`` is the phases of one ``Run``: its construction checks the configuration and prepares the run
directory before anything starts, then ``start`` / ``step`` per step / ``finish``, and ``close`` stops
the roles whatever happened.
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
from relax.models.initial_weights import sft_checkpoint
from relax.runtime.checks import roles as R
from relax.runtime.checks.entry import entry_config
from relax.runtime.checks.validation import validate
from relax.runtime.cluster.cluster import Runtime
from relax.runtime.cluster.local_runtime import LocalRuntime
from relax.runtime.driver.checkpoints import restore_checkpoint, save_checkpoint
from relax.runtime.driver.evaluation import Evaluation
from relax.runtime.driver.pipeline import Pipeline
from relax.runtime.files.checkpoint_files import check_checkpoint, read_checkpoint, superseded_warnings
from relax.runtime.files.console import log
from relax.runtime.files.metrics_log import MetricsLog, progress_line, summary_table
from relax.runtime.files.run_dir import lock_run_dir, run_of_checkpoint
from relax.runtime.files.run_errors import nothing_trained, skipped_step_warning
from relax.runtime.files.trackers import Trackers
from relax.runtime.files.user_errors import report as report_failure
from relax.runtime.preflight import preflight_once, was_checked
from relax.runtime.session.held_signals import signals_held


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
    # The first and the last evaluation (relax.runtime.driver.evaluation): their eval/* metrics, or None
    # without evaluation; e.g. eval_before["eval/correct/mean"] -> eval_after["eval/correct/mean"].
    eval_before: dict | None = None
    eval_after: dict | None = None


def saves_at(config, step: int) -> bool:
    """Whether a checkpoint is written after ``step``: the final step always (a run keeps its
    model), and every ``--save-interval`` steps."""
    return step == config.num_rollout or (bool(config.save_interval) and step % config.save_interval == 0)


# How long Ctrl-C / SIGTERM waits for the steps in flight to finish and the model to be saved.
INTERRUPT_SAVE_TIMEOUT_S = 60.0


def submit_limit(config, step: int) -> int:
    """The last step whose rollout may be submitted while ``step`` is collected: up to the staleness
    bound ahead (one step ahead in the synchronous schedule), never past the run's end nor past a
    checkpoint that is not written yet."""
    limit = min(step + 1 + config.staleness_bound, config.num_rollout)
    return next((t for t in range(step, limit + 1) if saves_at(config, t)), limit)


def _short(key: str) -> str:
    return key[:4]


class Run:
    """One ``run(config)``: what the driver holds between the phases of a run.

    ``Run(config)`` checks the configuration and prepares the run directory (nothing starts yet: a
    mistake raises before the roles exist); ``start()`` starts the roles, restores a checkpoint and
    evaluates the initial policy; ``step(step)`` runs, logs and maybe checkpoints one step;
    ``finish()`` prints the run's summary and returns its ``RunSummary``; ``close()`` stops the roles.
    """

    def __init__(self, config):
        self.t_start = time.perf_counter()
        config = entry_config(config)  # the type, and the defaults `relax train` derives (relax.runtime.checks.entry)
        torch.set_num_threads(1)
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())  # `relax train` is a console script: make the cwd importable
        self.config, self.algorithm_cls = config, load_algorithm(config.advantage_estimator)
        self._check()
        self.layout = R.derive_roles(self.algorithm_cls, config)
        self.out = output_dir_of(config)
        # Refuse another run's directory (unless resuming or --overwrite-output-dir) and hold its lock while
        # this run lives (re-entrant: `relax train` already holds it); relax.runtime.files.run_dir.
        self._run_dir_lock = lock_run_dir(self.out, resuming=config.load or False, overwrite=config.overwrite_output_dir)
        self.keys = tuple(config.algorithm.reward_keys)
        self.state, self.start_step = self._read_resume_state()
        resume_after = self.start_step if self.state else None
        self.metrics_log = MetricsLog(self.out / "metrics.jsonl", resume_after_step=resume_after,
                                      warn=lambda message: log(f"relax: warning: {message}"))
        self.trackers = Trackers(config, self.out, resume_after_step=resume_after)  # TensorBoard, W&B
        self._announce()
        # --in-process: the same roles in this process, without Ray (relax.runtime.cluster.local_runtime)
        self.runtime = (LocalRuntime if config.in_process else Runtime)(config, self.algorithm_cls, self.layout)
        self.pipeline = self.bar = self.evaluation = None
        self.last_ckpt = self.saved_step = None
        self.steps_run = 0
        self.steps_skipped = 0  # steps whose every prompt group was dropped (nothing trained)
        self.current_step = None  # the step being collected: a failure names it

    def _check(self) -> None:
        """The CLI's rules and pre-flight for every entry point: a RunConfig built in Python is refused as
        `relax train` would refuse it (ConfigError), before Ray starts. `relax train` has run both on this
        configuration already and printed their warnings (relax.runtime.preflight.was_checked)."""
        checked = was_checked(self.config)
        warnings = validate(self.config, self.algorithm_cls) + preflight_once(self.config, self.algorithm_cls)
        for warning in [] if checked else warnings:
            log(f"relax: warning: {warning}")

    def _read_resume_state(self) -> tuple[dict | None, int]:
        """``--load``: the checkpoint's state and step, and the original run's metrics copied into this
        run's directory (when it is another one); ``(None, 0)`` for a fresh run, and for a run that starts
        from a `relax sft` checkpoint (its weights: relax.models.initial_weights), which is not a resume."""
        config = self.config
        if not config.load or sft_checkpoint(config.load) is not None:
            return None, 0
        _, state = read_checkpoint(config.load)  # an unreadable or incomplete file: CheckpointError
        for warning in check_checkpoint(config, state, config.load, has_critic=R.CRITIC in self.layout):
            log(f"relax: warning: {warning}")  # hyper-parameters changed on resume (allowed)
        owner = run_of_checkpoint(config.load)  # the run directory the checkpoint belongs to, if any
        old_metrics = owner / "metrics.jsonl" if owner is not None else None
        new_metrics = self.out / "metrics.jsonl"
        if old_metrics is not None and old_metrics.exists() and old_metrics.resolve() != new_metrics.resolve():
            new_metrics.write_bytes(old_metrics.read_bytes())
        step = int(state["step"])
        for warning in superseded_warnings(config.load, self.out, step):
            log(f"relax: warning: {warning}")
        return state, step

    def _announce(self) -> None:
        """The banner: the method, where its roles run, the output directory (and the task's base rates)."""
        config, cls = self.config, self.algorithm_cls
        # --in-process places no role on Ray: the banner says where they really run
        roles = f"{', '.join(self.layout.roles)} (in this process)" if config.in_process else self.layout.describe()
        log(f"relax: {config.advantage_estimator} ({cls.__module__}.{cls.__qualname__}); roles: {roles}; "
            f"output: {self.out}")
        # the base rates of the task's own prompts and warm-up: not news for a run on a data file, a user's
        # environment or other weights (--load: a resumed run, or a `relax sft` checkpoint)
        if not (config.hf_checkpoint or config.prompt_data or config.env_path) and not config.load:
            with contextlib.suppress(Exception):
                from relax.models.tiny.calculator import TASK_CHECKPOINTS
                from relax.models.tiny.weights import warmup_base_rates

                rates = warmup_base_rates(TASK_CHECKPOINTS.get(config.task))  # the task's own tiny model
                log("relax: warm-up base rates: " + ", ".join(f"{k} {v:.3f}" for k, v in rates.items()))

    def start(self) -> None:
        """Start the roles, restore ``--load``'s checkpoint and evaluate the initial policy (step 0)."""
        config, resuming = self.config, self.state is not None
        self.runtime.start()
        if resuming:
            restore_checkpoint(self.runtime, self.state)
            log(f"relax: resumed from step {self.start_step} ({config.load})")
        self.t_ready = time.perf_counter()
        log(f"relax: start-up {self.t_ready - self.t_start:.1f}s (" + ", ".join(
            f"{k} {v:.1f}" for k, v in self.runtime.startup_times.items()) + ")")
        from tqdm import tqdm

        self.bar = tqdm(
            range(self.start_step, config.num_rollout), desc="train", unit="step", disable=not config.progress,
            initial=self.start_step, total=config.num_rollout, file=sys.stderr, dynamic_ncols=True,
        )
        self.pipeline = Pipeline(self.runtime, self.start_step)
        self.evaluation = Evaluation(config, self.runtime)  # --eval-*: docs/en/evaluation.md
        if resuming:
            self.evaluation.resume(self.metrics_log.rows)  # the original run's held-out "before"
        if self.evaluation.before_training(resuming=resuming):
            row = {"step": self.start_step, **self.evaluation.run(self.start_step)}  # step 0: the initial policy
            self._record(row)
            log(self.evaluation.line(row), self.bar)

    def step(self, step: int) -> None:
        """Collect step ``step`` (submitting the rollouts allowed ahead), evaluate when due, log the
        row, and write the checkpoint when one is due."""
        config = self.config
        self.current_step = step
        row = self.pipeline.step(step, submit_through=submit_limit(config, step))
        if self.evaluation.due(step):  # version `step`: the weights this step trained
            row.update(self.evaluation.run(step, self.pipeline.latest_weights))
            log(self.evaluation.line(row), self.bar)
        self._record_step(row)
        self._show_progress(step, row)
        if saves_at(config, step):
            self.last_ckpt = save_checkpoint(self.runtime, self.out, step)
            self.saved_step = step
            self.pipeline.checkpointed(step)

    def _record(self, row: dict) -> None:
        self.metrics_log.write(row)
        self.trackers.log(row)

    def _record_step(self, row: dict) -> None:
        """Log a trained step's row. Taking it from the pipeline and writing it is one piece, so the
        metrics log holds every step the saved model trained, once, whenever Ctrl-C comes."""
        with signals_held():
            self.metrics_log.write(row)
            self.pipeline.logged(row["step"])
            self.steps_run += 1
        self.trackers.log(row)
        if row.get("train/skipped"):
            self.steps_skipped += 1
            log(skipped_step_warning(self.config, row), self.bar)

    def _show_progress(self, step: int, row: dict) -> None:
        """The progress bar's rewards (and staleness), or with ``--no-progress`` a line every ``--log-interval``."""
        config = self.config
        shown = (config.reward_key,) if config.reward_key else self.keys  # --reward-key: the run's reward
        postfix = {_short(k): f"{row.get(f'reward/{k}/mean', float('nan')):.2f}" for k in shown}
        if config.fully_async:
            postfix["stale"] = f"{row.get('async/staleness_max', 0):.0f}"
        self.bar.set_postfix(postfix, refresh=False)
        if not config.progress and (step % config.log_interval == 0 or step == config.num_rollout):
            log(progress_line(row, self.keys, config.num_rollout, config.reward_key))

    def finish(self) -> RunSummary:
        """Close the pipeline, print the run's table and timings, and return its ``RunSummary``."""
        self.pipeline.close()
        self.bar.close()
        t_end, out, steps_run = time.perf_counter(), self.out, self.steps_run
        trained_rows = [r for r in self.metrics_log.rows if r["step"] > 0]  # not the evaluation before training
        table, stats = summary_table(trained_rows, self.keys, self.config.reward_key)
        log("\n" + table)
        train_s, startup_s = t_end - self.t_ready, self.t_ready - self.t_start
        model = self.last_ckpt.parent if self.last_ckpt else "not saved"
        log(f"relax: {steps_run} steps in {train_s:.1f}s ({train_s / max(steps_run, 1):.3f}s/step), "
            f"start-up {startup_s:.1f}s; metrics: {out / 'metrics.jsonl'}; model: {model}")
        eval_line = self.evaluation.summary_line()  # the held-out score before -> after, last
        if eval_line:
            log(eval_line)
        eval_before, eval_after = self.evaluation.before_after()
        if steps_run and self.steps_skipped == steps_run:
            raise nothing_trained(self.config, steps_run)  # exit 1 after the run's summary: it changed nothing
        return RunSummary(
            output_dir=str(out), steps_run=steps_run, last_step=self.start_step + steps_run, reward_first_last=stats,
            startup_s=startup_s, train_s=train_s, total_s=t_end - self.t_start,
            metrics_path=str(out / "metrics.jsonl"), checkpoint=str(self.last_ckpt) if self.last_ckpt else None,
            eval_before=eval_before, eval_after=eval_after,
        )

    def interrupted(self) -> None:
        """Ctrl-C or SIGTERM: the workers are still alive here, so save before they stop (bounded)."""
        log("relax: interrupted; shutting down the workers", self.bar)
        self._save_on_interrupt()

    def _save_on_interrupt(self):
        """Ctrl-C or SIGTERM once a step has trained: log the steps collected and not logged yet, finish
        the steps already submitted (their rollouts have drawn prompts, so the saved state must include
        them), log them, then save — all within ``INTERRUPT_SAVE_TIMEOUT_S``. Says where the model went,
        or why it was not saved."""
        runtime, pipeline, out, saved_step, bar = self.runtime, self.pipeline, self.out, self.saved_step, self.bar
        if pipeline is not None:
            with signals_held():
                for t in sorted(pipeline.collected):
                    self._record_step(pipeline.collected[t])
        if pipeline is None or self.steps_run == 0:
            log("relax: no step finished training, so no model was saved", bar)
            return None
        deadline = time.monotonic() + INTERRUPT_SAVE_TIMEOUT_S
        step = None
        try:
            for t in sorted(pipeline.submitted):
                pipeline.step(t, submit_through=t, timeout=max(1.0, deadline - time.monotonic()))
                self._record_step(pipeline.collected[t])
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

    def close(self) -> None:
        self.trackers.close()
        if self.bar is not None:
            self.bar.close()
        self.runtime.stop()


def run(config) -> RunSummary:
    """Train with ``config`` (a ``RunConfig``); returns a ``RunSummary``. A mistake raises
    ``ConfigError`` (``PreflightError`` for what the configuration points at) before anything starts;
    an argument that is not a ``RunConfig`` raises ``TypeError``."""
    this = Run(config)
    try:
        this.start()
        for index in this.bar:
            this.step(index + 1)
        return this.finish()
    except KeyboardInterrupt:
        this.interrupted()
        raise
    except Exception as exc:
        report_failure(exc, this.out, this.current_step)  # <out>/error.log; the user's frames for `relax train`
        raise
    finally:
        this.close()
