"""Per-step reward statistics, the metrics file and the end-of-run summary table."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch


def reward_stats(rewards: torch.Tensor, group_ids: torch.Tensor, keys: Sequence[str]) -> dict[str, float]:
    """``reward/<key>/mean``, ``/std`` (population) and ``/zero_std_frac`` (share of prompt groups
    where the component is constant) for every column of the raw ``[N, K]`` reward matrix."""
    out: dict[str, float] = {}
    if rewards.shape[0] == 0:
        return out
    uniq, inverse = torch.unique(group_ids, return_inverse=True)
    for k, key in enumerate(keys):
        col = rewards[:, k].double()
        out[f"reward/{key}/mean"] = float(col.mean())
        out[f"reward/{key}/std"] = float(col.std(unbiased=False))
        lo = torch.full((len(uniq),), math.inf, dtype=torch.float64).scatter_reduce(0, inverse, col, "amin")
        hi = torch.full((len(uniq),), -math.inf, dtype=torch.float64).scatter_reduce(0, inverse, col, "amax")
        out[f"reward/{key}/zero_std_frac"] = float((lo == hi).double().mean())
    return out


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


def summary_table(rows: Sequence[Mapping], keys: Sequence[str]) -> tuple[str, dict[str, tuple[float, float]]]:
    """Mean of each ``reward/<key>/mean`` over the first and the last 10% of steps (at least one)."""
    if not rows:
        return "no steps were run", {}
    k = max(1, len(rows) // 10)
    first, last = rows[:k], rows[-k:]
    stats: dict[str, tuple[float, float]] = {}
    lines = [f"reward component     first {k} step(s)   last {k} step(s)   change", "-" * 64]
    for key in keys:
        name = f"reward/{key}/mean"
        a = [r[name] for r in first if name in r]
        b = [r[name] for r in last if name in r]
        if not a or not b:
            continue
        fa, lb = sum(a) / len(a), sum(b) / len(b)
        stats[key] = (fa, lb)
        lines.append(f"{key:<20} {fa:>16.3f} {lb:>17.3f} {lb - fa:>+8.3f}")
    return "\n".join(lines), stats
