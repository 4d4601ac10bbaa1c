"""Experiment trackers: every metrics row of a run also goes to TensorBoard and/or Weights & Biases,
and ``--log-completions N`` samples per step go to ``completions.jsonl`` and to the trackers.

The driver (``relax.runtime.driver.train``) creates one ``Trackers`` next to its ``MetricsLog``, hands it
every row it writes to ``metrics.jsonl`` and closes it at the end. Each numeric key of a row (all
but ``step``) is logged under its own name with the row's ``step``, so the trackers show exactly the
numbers of ``metrics.jsonl`` (TensorBoard stores scalars as float32); the effective configuration is
logged as the run's hyper-parameters.

- ``--use-tensorboard``: event files directly in the run directory, so ``tensorboard --logdir
  outputs`` lists every run under its name. A resumed run hides the steps after its checkpoint
  (``purge_step``), like ``metrics.jsonl`` drops them; a fresh run hides any older events there.
- ``--use-wandb``: a W&B run in ``<run dir>/wandb``. It never blocks on the network: the mode is
  ``WANDB_MODE`` when set; otherwise online only when an API key is configured *and* the server
  answers within a few seconds, else offline (upload later with ``wandb sync <run dir>/wandb/offline-run-*``).
- ``--log-completions N``: the first N samples of every step (``relax.runtime.metrics.step_metrics.completion_records``)
  and of every evaluation (``relax.runtime.driver.evaluation``) with their ``step`` and ``split`` (``train`` or
  ``eval``), one JSON object per line in ``completions.jsonl``; TensorBoard shows them as a
  markdown table in its text dashboard, W&B as a table named ``completions``.

Both packages are optional (``pip install -e '.[tracking]'``) and imported only when their flag
is on. A tracker that fails while the run is going is switched off with one warning: a tracker
problem never stops the training.
"""

from __future__ import annotations

import contextlib
import json
import netrc
import os
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlparse

import attrs

from relax.runtime.metrics.step_metrics import COMPLETIONS_KEY, EVAL_COMPLETIONS_KEY

EXTRA_HINT = "pip install -e '.[tracking]'"
WANDB_DEFAULT_HOST = "https://api.wandb.ai"
REACHABLE_TIMEOUT_S = 3.0


def _warn(message: str) -> None:
    print(f"relax: {message}", file=sys.stderr, flush=True)


def flat_config(config) -> dict:
    """The effective configuration as one flat ``{field: value}`` mapping (the algorithm's fields at
    the top level, as in ``config.yaml``); tuples become lists."""

    def plain(value):
        return [plain(v) for v in value] if isinstance(value, (tuple, list)) else value

    flat = {}
    for name, value in attrs.asdict(config, recurse=False).items():
        if name == "algorithm":
            flat.update({k: plain(v) for k, v in attrs.asdict(value, recurse=False).items()})
        else:
            flat[name] = plain(value)
    return flat


def scalars_of(row: Mapping) -> dict[str, float]:
    """The row's numeric values by key (booleans as 0/1; ``step`` and non-numbers left out)."""
    return {k: float(v) for k, v in row.items() if k != "step" and isinstance(v, (int, float))}


class TensorBoardTracker:
    name = "tensorboard"

    def __init__(self, out: Path, hparams: Mapping, metric_keys, resume_after_step: int | None):
        try:
            from torch.utils.tensorboard import SummaryWriter
            from torch.utils.tensorboard.summary import hparams as hparams_summary
        except ImportError as exc:
            raise RuntimeError(f"--use-tensorboard needs the tensorboard package ({exc}); {EXTRA_HINT}") from exc
        # Training steps start at 1, the evaluation before training is step 0. Purging from the first
        # step this run writes hides, in TensorBoard, the steps a resumed run redoes, and a run
        # overwritten with --overwrite-output-dir entirely.
        purge = resume_after_step + 1 if resume_after_step is not None else 0
        self.writer = SummaryWriter(log_dir=str(out), purge_step=purge, flush_secs=10)
        # The HParams dashboard takes numbers, strings and booleans; anything else as its JSON text.
        values = {
            k: v if isinstance(v, (bool, int, float, str)) else json.dumps(v) for k, v in hparams.items()
        }
        for summary in hparams_summary(values, {key: 0.0 for key in metric_keys}):
            self.writer.file_writer.add_summary(summary)
        text = "\n".join(f"    {k}: {json.dumps(v)}" for k, v in hparams.items())  # markdown code block
        self.writer.add_text("config", text, global_step=0)

    def log(self, step: int, scalars: Mapping[str, float], samples: list[dict]) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, global_step=step)
        if samples:
            self.writer.add_text("completions", completions_markdown(samples), global_step=step)

    def close(self) -> None:
        self.writer.close()


def _wandb_api_key_configured() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", WANDB_DEFAULT_HOST)).hostname or ""
    with contextlib.suppress(Exception):
        return netrc.netrc().authenticators(host) is not None
    return False


def _reachable(url: str, timeout: float = REACHABLE_TIMEOUT_S) -> bool:
    """Whether the server at ``url`` answers an HTTP request within ``timeout`` seconds (any HTTP
    status counts: the point is that it speaks HTTP; a proxy that accepts every connection but never
    answers does not). Name lookup included: a resolver without network can hang far longer than a
    socket timeout, so the probe runs in a daemon thread that is abandoned when the time is up."""
    import urllib.error
    import urllib.request

    answer: list[bool] = []

    def probe() -> None:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout):
                answer.append(True)
        except urllib.error.HTTPError:  # the server answered, with an error status
            answer.append(True)
        except (OSError, ValueError):
            answer.append(False)

    thread = threading.Thread(target=probe, name="relax-wandb-probe", daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(answer and answer[0])


def wandb_mode() -> tuple[str, str]:
    """``(mode, why)``: ``WANDB_MODE`` when set; online only with an API key and a server that
    answers; otherwise offline."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"], "WANDB_MODE"
    if not _wandb_api_key_configured():
        return "offline", "no W&B API key is configured"
    base = os.environ.get("WANDB_BASE_URL", WANDB_DEFAULT_HOST)
    if not _reachable(base):
        return "offline", f"{base} is not reachable"
    return "online", "API key configured and server reachable"


class WandbTracker:
    name = "wandb"

    def __init__(self, config, out: Path, hparams: Mapping, run_name: str):
        try:
            import wandb
        except ImportError as exc:
            raise RuntimeError(f"--use-wandb needs the wandb package ({exc}); {EXTRA_HINT}") from exc
        self.wandb = wandb
        mode, why = wandb_mode()
        kwargs = {
            "project": config.wandb_project,
            "group": config.wandb_group,
            "name": config.wandb_run_name or run_name,
            "dir": str(out),
            "config": dict(hparams),
            "reinit": "create_new",
            # no console capture: the progress bar and the workers' log lines stay as they are
            "settings": wandb.Settings(console="off", silent=True),
        }
        try:
            self.run = wandb.init(mode=mode, **kwargs)
        except Exception as exc:  # e.g. a server that accepts connections but fails
            if mode == "offline":
                raise
            _warn(f"W&B {mode} start failed ({exc}); logging offline instead")
            mode, why = "offline", "the online start failed"
            self.run = wandb.init(mode=mode, **kwargs)
        if mode == "disabled":
            _warn(f"W&B disabled ({why}): nothing is logged to W&B")
            return
        where = Path(self.run.dir).parent  # <out>/wandb/<run>/files -> <out>/wandb/<run>
        hint = f"; upload it later with: wandb sync {where}" if mode == "offline" else ""
        _warn(f"W&B run {mode} ({why}): {where}{hint}")

    def log(self, step: int, scalars: Mapping[str, float], samples: list[dict]) -> None:
        values = dict(scalars)
        if samples:
            columns = list(flat_sample(samples[0]))
            values["completions"] = self.wandb.Table(
                columns=columns, data=[[flat_sample(x)[c] for c in columns] for x in samples]
            )
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()
        # finish() can return before the W&B service has written the run file; teardown waits for
        # it, so the run directory is complete (ready for `wandb sync`) when the run returns.
        self.wandb.teardown()


def flat_sample(sample: Mapping) -> dict:
    """One completion record as table columns: ``rewards`` spread into ``reward/<key>``; a label
    that is not a plain value as its JSON text."""
    out = {}
    for key, value in sample.items():
        if key == "rewards":
            out.update({f"reward/{k}": v for k, v in value.items()})
        else:
            out[key] = value if value is None or isinstance(value, (bool, int, float, str)) else json.dumps(value)
    return out


def completions_markdown(samples: list[dict]) -> str:
    """A markdown table of the samples (TensorBoard's text dashboard renders it)."""
    rows = [flat_sample(x) for x in samples]
    columns = list(rows[0])

    def cell(value) -> str:
        text = f"{value:.4g}" if isinstance(value, float) else str(value)
        return text.replace("|", "\\|").replace("\n", "\\n")

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r[c]) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


class CompletionsLog:
    """``completions.jsonl``: one JSON object per logged sample, with its ``step``. On resume, lines
    after the checkpoint's step are dropped first (as ``MetricsLog`` does)."""

    def __init__(self, path: Path, resume_after_step: int | None = None):
        self.path = Path(path)
        if resume_after_step is not None and self.path.exists():
            kept = [line for line in self.path.read_text().splitlines()
                    if line.strip() and json.loads(line)["step"] <= resume_after_step]
            self.path.write_text("".join(line + "\n" for line in kept))
        elif self.path.exists():
            self.path.unlink()

    def write(self, samples: list[dict]) -> None:
        with self.path.open("a") as f:
            f.writelines(json.dumps(sample) + "\n" for sample in samples)


class Trackers:
    """The enabled trackers of one run. ``log(row)`` takes each row written to ``metrics.jsonl``;
    ``close()`` flushes and finishes them (call it once, also when the run fails)."""

    def __init__(self, config, out: Path, resume_after_step: int | None = None):
        out = Path(out)
        hparams = flat_config(config)
        metric_keys = [f"reward/{key}/mean" for key in config.algorithm.reward_keys]
        self.trackers: list = []
        self.log_completions = config.log_completions
        self.completions = (
            CompletionsLog(out / "completions.jsonl", resume_after_step) if config.log_completions else None
        )
        try:
            if config.use_tensorboard:
                self.trackers.append(TensorBoardTracker(out, hparams, metric_keys, resume_after_step))
            if config.use_wandb:
                self.trackers.append(WandbTracker(config, out, hparams, run_name=config.run_name or out.name))
        except BaseException:
            self.close()
            raise

    def log(self, row: Mapping) -> None:
        step = int(row["step"])
        # the training samples, then the evaluation's (relax.runtime.driver.evaluation), each marked by its split
        samples = [{"step": step, "split": "train", **x} for x in row.get(COMPLETIONS_KEY, ())[: self.log_completions]]
        samples += [{"step": step, "split": "eval", **x} for x in row.get(EVAL_COMPLETIONS_KEY, ())[: self.log_completions]]
        if self.completions is not None and samples:
            self.completions.write(samples)
        scalars = scalars_of(row)
        for tracker in list(self.trackers):
            try:
                tracker.log(step, scalars, samples)
            except Exception as exc:  # noqa: BLE001 - a tracker never stops the training
                _warn(f"the {tracker.name} tracker failed at step {step} ({exc!r}); it is switched off")
                self.trackers.remove(tracker)
                with contextlib.suppress(Exception):
                    tracker.close()

    def close(self) -> None:
        trackers, self.trackers = self.trackers, []
        for tracker in trackers:
            try:
                tracker.close()
            except Exception as exc:  # noqa: BLE001
                _warn(f"closing the {tracker.name} tracker failed: {exc!r}")
