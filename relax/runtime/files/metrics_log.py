"""Where a run's metrics are written and read back: ``metrics.jsonl``, the ``--no-progress`` summary
line and the end-of-run table. The metrics themselves are computed in ``relax.runtime.metrics.step_metrics``;
the trackers (TensorBoard, W&B) are ``relax.runtime.files.trackers``; docs/en/tracking.md lists the metrics."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from relax.algorithms.diagnostics import format_summary_table, summarize_diagnostics
from relax.runtime.files.run_errors import RunFailed
from relax.runtime.metrics.step_metrics import COMBINED, COMPLETIONS_KEY, EVAL_COMPLETIONS_KEY


class MetricsFileError(RunFailed):
    """``metrics.jsonl`` has a damaged line that is not the last one (a partial last line is what a
    crash mid-write leaves, and is dropped instead); the message names the file and the line."""


def read_metrics(path: Path) -> tuple[list[dict], str | None]:
    """The rows of a ``metrics.jsonl`` -> ``(rows, warning)``. A last line that is not a complete
    JSON object (a kill -9 or a full disk mid-write) is dropped and ``warning`` says so; any other
    line that is not a JSON object with an integer ``step`` raises ``MetricsFileError``."""
    path = Path(path)
    lines = path.read_bytes().split(b"\n")
    numbered = [(n, line) for n, line in enumerate(lines, 1) if line.strip()]
    rows, warning = [], None
    for i, (number, raw) in enumerate(numbered):
        try:
            row = json.loads(raw.decode("utf-8"))
            problem = None if isinstance(row, dict) else f"a JSON {type(row).__name__}, not an object"
            if problem is None and (not isinstance(row.get("step"), int) or isinstance(row.get("step"), bool)):
                problem = f"no integer 'step' (got {row.get('step')!r})"
        except UnicodeDecodeError:
            problem = "not UTF-8 text"
        except json.JSONDecodeError as exc:
            problem = f"not valid JSON ({exc.msg})"
        if problem is None:
            rows.append(row)
        elif i == len(numbered) - 1 and problem != "not UTF-8 text" and "integer 'step'" not in problem:
            warning = (f"{path}: line {number} is incomplete ({len(raw)} bytes, {problem}), as a crash mid-write "
                       "leaves it; dropped it")
        else:
            raise MetricsFileError(
                f"{path}: line {number} is {problem}; each line must be one JSON object with an integer 'step' "
                f"(fix or delete that line; {len(rows)} rows before it are intact)"
            )
    return rows, warning


class MetricsLog:
    """``metrics.jsonl``: one JSON object per step. On resume, lines after the checkpoint's step
    are dropped first (a run that died after its last checkpoint logged steps that will be redone),
    and so is a partial last line (``read_metrics``; ``warn`` receives its warning)."""

    def __init__(self, path: Path, resume_after_step: int | None = None, warn=None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.rows: list[dict] = []
        if resume_after_step is not None and self.path.exists():
            rows, warning = read_metrics(self.path)
            if warning and warn is not None:
                warn(warning)
            self.rows = [r for r in rows if r["step"] <= resume_after_step]
            self.path.write_text("".join(json.dumps(r) + "\n" for r in self.rows))
        elif self.path.exists():
            self.path.unlink()

    def write(self, row: Mapping) -> None:
        row = {k: v for k, v in row.items() if k not in (COMPLETIONS_KEY, EVAL_COMPLETIONS_KEY)}
        try:
            with self.path.open("a") as f:
                f.write(json.dumps(row) + "\n")
        except OSError as exc:  # a full disk: one line; a partial line is dropped on resume (read_metrics)
            raise RunFailed(f"{self.path}: writing the metrics of step {row.get('step')} failed: "
                            f"{exc.strerror or exc}; the rows before it are kept") from exc
        self.rows.append(row)


# Diagnostics shown below the reward table at the end of a run (besides each component's mean).
SUMMARY_DIAGNOSTICS = ("zero_std_frac", "adv_share", "multi_reward/")


def summary_table(
    rows: Sequence[Mapping], keys: Sequence[str], reward_key: str | None = None
) -> tuple[str, dict[str, tuple[float, float]]]:
    """The end-of-run table: each ``reward/<key>/mean`` over the first and the last 10% of steps (at
    least one), then the multi-reward diagnostics over the same windows. Returns ``(table, {key:
    (first, last)})``. Windows follow ``summarize_diagnostics``. ``reward_key`` (``--reward-key``): the
    run's reward, listed first and marked ``*``."""
    if not rows:
        return "no steps were run", {}
    summary = summarize_diagnostics(rows, fraction=0.1)
    k = next(iter(summary.values())).window if summary else max(1, -(-len(rows) // 10))
    stats: dict[str, tuple[float, float]] = {}
    lines = [f"reward component     first {k} step(s)   last {k} step(s)   change", "-" * 64]
    ordered = ([reward_key] if reward_key in keys else []) + [key for key in keys if key != reward_key]
    for key in ordered:
        s = summary.get(f"reward/{key}/mean")
        if s is None or s.first is None or s.last is None:
            continue
        stats[key] = (s.first, s.last)
        label = f"{key} *" if key == reward_key else key
        lines.append(f"{label:<20} {s.first:>16.3f} {s.last:>17.3f} {s.last - s.first:>+8.3f}")
    if reward_key in stats:
        lines.append(f"* the run's reward (--reward-key {reward_key})")
    extra = {name: s for name, s in summary.items() if any(part in name for part in SUMMARY_DIAGNOSTICS)}
    if extra:
        lines += ["", format_summary_table(extra)]
    return "\n".join(lines), stats


def progress_line(row: Mapping, keys: Sequence[str], total_steps: int, reward_key: str | None = None) -> str:
    """The one-line summary ``--no-progress`` prints every ``--log-interval`` steps: the run's reward
    (the ``--reward-key`` component, when given), each component's mean reward, the combined reward,
    the mean response length and the step time."""
    def number(key, fmt):
        value = row.get(key)
        return format(value, fmt) if isinstance(value, (int, float)) else "n/a"

    parts = [f"relax: step {row['step']}/{total_steps}"]
    if reward_key is not None:
        parts.append(f"reward ({reward_key}) {number(f'reward/{reward_key}/mean', '.3f')}")
    parts.append(" ".join(f"{k} {number(f'reward/{k}/mean', '.3f')}" for k in keys))
    if f"reward/{COMBINED}/mean" in row and len(keys) > 1:
        parts.append(f"combined {number(f'reward/{COMBINED}/mean', '.3f')}")
    parts.append(f"response len {number('rollout/response_len', '.1f')}")
    parts.append(f"{number('time/step_s', '.2f')} s/step")
    return " | ".join(parts)


