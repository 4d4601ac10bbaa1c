"""Per-step metrics and where they are written: the reward statistics (with the combined reward), the
always-on rollout health metrics (response length, truncation, tokens/s), the ``--log-completions``
records, ``metrics.jsonl``, the ``--no-progress`` summary line and the end-of-run table. The
trackers (TensorBoard, W&B) are ``relax.runtime.trackers``; docs/en/tracking.md lists the metrics."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from relax.algorithms.diagnostics import format_summary_table, summarize_diagnostics
from relax.runtime.run_errors import RunFailed


def reward_metrics(algorithm, rewards: torch.Tensor, group_ids: torch.Tensor, keys: Sequence[str]) -> dict[str, float]:
    """The step's reward statistics and diagnostics: ``algorithm.reward_diagnostics`` of the raw
    ``[N, K]`` rewards (``reward/<key>/{mean,std,zero_std_frac}``, ``multi_reward/*``, and what the
    method adds, e.g. GDPO's ``gdpo/<key>/adv_share``). ``keys`` names the columns of ``rewards``
    and must be the algorithm's ``reward_keys``.

    Call it on the *whole* rollout, before the group filter: the groups it drops are part of what
    ``zero_std_frac`` and ``multi_reward/gdpo_cancel_rate`` count. The advantages are computed later
    by another role, so ``advantage/*`` is not part of it.
    """
    if tuple(keys) != tuple(algorithm.config.reward_keys):
        raise ValueError(
            f"reward columns {tuple(keys)} differ from the algorithm's reward_keys "
            f"{tuple(algorithm.config.reward_keys)}"
        )
    metrics = algorithm.reward_diagnostics(rewards, group_ids)
    metrics.update(combined_reward_metrics(rewards, algorithm.config.reward_weights, keys))
    return metrics


COMBINED = "combined"


def combined_reward_metrics(rewards: torch.Tensor, weights: Sequence[float], keys: Sequence[str]) -> dict[str, float]:
    """``reward/combined/mean``: the mean over samples of the ``--reward-weights``-weighted sum of the
    components (float64). Left out when a component is itself named ``combined``."""
    if COMBINED in keys or rewards.numel() == 0:
        return {}
    matrix = rewards.double().reshape(rewards.shape[0], -1)
    combined = matrix @ torch.tensor(tuple(weights), dtype=torch.float64)
    return {f"reward/{COMBINED}/mean": float(combined.mean())}


# A row's sample completions (a list of records, ``--log-completions``): not a metric.
# ``MetricsLog`` leaves it out of metrics.jsonl; ``relax.runtime.trackers`` writes it to
# completions.jsonl and to the trackers.
COMPLETIONS_KEY = "_completions"
# The evaluation's sample completions (relax.runtime.evaluation), kept out of metrics.jsonl the same way.
EVAL_COMPLETIONS_KEY = "_eval_completions"


def _jsonable(value):
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


def completion_records(config, prompts, completions, labels, rewards: torch.Tensor, keep: torch.Tensor,
                       normalized: torch.Tensor, version: int) -> list[dict]:
    """Up to ``--log-completions`` samples of one rollout worker (its first ones, whole prompt groups
    first; with several workers each gives its share, the driver keeps the first N): the prompt, the
    completion as the reward function saw it, the label, every reward component, the scalar the
    method's ``normalize_rewards`` made of them (None when the group was dropped) and the policy
    version (the training step whose weights generated it)."""
    workers = getattr(config, "rollout_num_workers", 1)
    limit = min(-(-config.log_completions // workers), len(completions))
    if limit <= 0:
        return []
    matrix = rewards.reshape(rewards.shape[0], -1)
    position = keep.long().cumsum(0) - 1  # sample -> its row among the kept samples
    keys = tuple(config.algorithm.reward_keys)
    return [
        {
            "policy_version": int(version),
            "prompt": prompts[i],
            "completion": completions[i],
            "label": _jsonable(labels[i]),
            "rewards": {key: float(matrix[i, j]) for j, key in enumerate(keys)},
            "normalized_reward": float(normalized[position[i]]) if bool(keep[i]) else None,
        }
        for i in range(limit)
    ]


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


def response_stats(response_ids: torch.Tensor, response_mask: torch.Tensor, max_new_tokens: int, eos_id: int) -> dict:
    """One rollout worker's response-length statistics for ``response_metrics``: the longest
    response, and how many responses reached ``max_new_tokens`` without ending in ``eos_id``
    (truncated at the length limit)."""
    lengths = response_mask.sum(1)
    if lengths.numel() == 0:
        return {"response_len_max": 0, "truncated": 0}
    full = lengths >= max_new_tokens
    truncated = full & (response_ids[:, -1] != eos_id) if response_ids.shape[1] else full
    return {"response_len_max": int(lengths.max()), "truncated": int(truncated.sum())}


def response_metrics(rolls: Sequence[Mapping]) -> dict[str, float]:
    """The step's always-on generation health metrics over the reports of its rollout workers:
    ``rollout/response_len_max``, ``rollout/truncated_frac`` (share of responses cut at
    ``--rollout-max-response-len``) and ``rollout/tokens_per_s`` (generated tokens over the slowest
    worker's generation time). A report without the statistics of ``response_stats`` adds nothing.
    The workers' ``completion_records`` (``--log-completions``) travel along under ``COMPLETIONS_KEY``."""
    out: dict[str, float] = {}
    samples = sum(r["samples"] for r in rolls)
    if rolls and all("response_len_max" in r for r in rolls):
        out["rollout/response_len_max"] = max(r["response_len_max"] for r in rolls)
        out["rollout/truncated_frac"] = sum(r["truncated"] for r in rolls) / max(samples, 1)
    generate_s = max((r.get("times", {}).get("time/rollout/generate_s", 0.0) for r in rolls), default=0.0)
    if generate_s > 0:
        out["rollout/tokens_per_s"] = sum(r["generated_tokens"] for r in rolls) / generate_s
    samples = [record for r in rolls for record in r.get("completions", ())]  # in worker order
    if samples:
        out[COMPLETIONS_KEY] = samples
    return out


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


def gpu_peak_mib(name: str) -> dict[str, float]:
    """``{name: MiB}``: the most GPU memory this process's tensors have held (``torch.cuda.max_memory_allocated``),
    or nothing where the process has not touched a GPU."""
    import torch

    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return {}
    return {name: round(torch.cuda.max_memory_allocated() / 2**20, 1)}
