"""Per-step reward metrics, the metrics file and the end-of-run summary table."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from relax.algorithms.diagnostics import format_summary_table, summarize_diagnostics


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
    return algorithm.reward_diagnostics(rewards, group_ids)


class MetricsLog:
    """``metrics.jsonl``: one JSON object per step. On resume, lines after the checkpoint's step
    are dropped first (a run that died after its last checkpoint logged steps that will be redone)."""

    def __init__(self, path: Path, resume_after_step: int | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.rows: list[dict] = []
        if resume_after_step is not None and self.path.exists():
            kept = []
            for line in self.path.read_text().splitlines():
                if line.strip():
                    row = json.loads(line)
                    if row["step"] <= resume_after_step:
                        kept.append(row)
            self.rows = kept
            self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))
        elif self.path.exists():
            self.path.unlink()

    def write(self, row: Mapping) -> None:
        row = dict(row)
        self.rows.append(row)
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")


# Diagnostics shown below the reward table at the end of a run (besides each component's mean).
SUMMARY_DIAGNOSTICS = ("zero_std_frac", "adv_share", "multi_reward/")


def summary_table(rows: Sequence[Mapping], keys: Sequence[str]) -> tuple[str, dict[str, tuple[float, float]]]:
    """The end-of-run table: each ``reward/<key>/mean`` over the first and the last 10% of steps (at
    least one), then the multi-reward diagnostics over the same windows. Returns ``(table, {key:
    (first, last)})``. Windows follow ``summarize_diagnostics``."""
    if not rows:
        return "no steps were run", {}
    summary = summarize_diagnostics(rows, fraction=0.1)
    k = next(iter(summary.values())).window if summary else max(1, -(-len(rows) // 10))
    stats: dict[str, tuple[float, float]] = {}
    lines = [f"reward component     first {k} step(s)   last {k} step(s)   change", "-" * 64]
    for key in keys:
        s = summary.get(f"reward/{key}/mean")
        if s is None or s.first is None or s.last is None:
            continue
        stats[key] = (s.first, s.last)
        lines.append(f"{key:<20} {s.first:>16.3f} {s.last:>17.3f} {s.last - s.first:>+8.3f}")
    extra = {name: s for name, s in summary.items() if any(part in name for part in SUMMARY_DIAGNOSTICS)}
    if extra:
        lines += ["", format_summary_table(extra)]
    return "\n".join(lines), stats
