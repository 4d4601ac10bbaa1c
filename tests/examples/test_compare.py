"""examples/gdpo/compare.py: the --quick smoke run, and the report prose generated from the numbers."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "gdpo" / "compare.py"
NUMBER_PAIR = re.compile(r"^(-?\d+\.\d+) ± (\d+\.\d+)$")


def _load_compare():
    spec = importlib.util.spec_from_file_location("gdpo_compare", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _table_rows(report: str) -> dict[tuple[str, str], dict[str, str]]:
    lines = [ln for ln in report.splitlines() if ln.startswith("| ")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for ln in lines[1:]:
        cells = dict(zip(head, (c.strip() for c in ln.strip("|").split("|"))))
        rows[(cells["setting"], cells["method"])] = cells
    return rows


def _expected(runs, setting, method, column):
    """Mean ± sample std over seeds, recomputed here from the per-step metrics."""
    mine = [r for r in runs if r["setting"] == setting and r["method"].upper() == method]
    values = []
    for r in mine:
        hist = r["history"]
        w = max(1, math.ceil(0.1 * len(hist)))
        if column == "greedy acc (100)":
            values.append(r["greedy_accuracy"])
        elif column == "collapse rate":
            values.append(sum(h["multi_reward/collapse_rate"] for h in hist) / len(hist))
        else:
            values.append(sum(h[f"reward/{column}/mean"] for h in hist[-w:]) / w)
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


@pytest.mark.timeout(300)
def test_quick_run_writes_plot_report_and_matching_numbers(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--out", str(tmp_path)],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    png = (tmp_path / "compare.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    report = (tmp_path / "report.md").read_text()
    runs = json.loads((tmp_path / "runs.json").read_text())

    compare = _load_compare()
    settings, seeds, steps = compare.QUICK["settings"], compare.QUICK["seeds"], compare.QUICK["steps"]
    assert len(runs) == len(settings) * seeds * 2
    assert all(len(r["history"]) == steps for r in runs)

    rows = _table_rows(report)
    assert set(rows) == {(s, m) for s in settings for m in ("GRPO", "GDPO")}
    checked = 0
    for (setting, method), cells in rows.items():
        for column, cell in cells.items():
            if column in ("setting", "method") or cell == "—":
                continue
            match = NUMBER_PAIR.match(cell)
            assert match, f"{setting} {method} {column}: {cell!r} is not 'mean ± std'"
            mean, std = _expected(runs, setting, method, column)
            assert float(match[1]) == pytest.approx(mean, abs=6e-4), (setting, method, column)
            assert float(match[2]) == pytest.approx(std, abs=6e-4), (setting, method, column)
            checked += 1
    assert checked == 2 * (6 + 7 + 7)  # per method: A has 4 components + 2 columns, C and D 5 + 2
    # the extra components only appear where the task has them
    assert rows[("A", "GRPO")]["brevity"] == "—" and rows[("C", "GDPO")]["judge"] == "—"
    assert "smoke configuration" in report


def _fake_table(grpo_correct, gdpo_correct, *, first=0.13, extra=None, n=3, spread=0.01):
    """A table in ``aggregate``'s format: per-seed correct values around the given means."""
    comp = ["correct", "digits", "format", "length"] + ([extra] if extra else [])

    def method(correct):
        per_seed = [correct - spread, correct, correct + spread]
        pair = (statistics.mean(per_seed), statistics.stdev(per_seed))
        last = {k: (0.5, 0.0) for k in comp}
        last["correct"] = pair
        return {
            "seeds": list(range(n)),
            "steps": 100,
            "components": comp,
            "scales": [1] * len(comp),
            "last": last,
            "first": {k: (first, 0.0) for k in comp},
            "greedy_accuracy": pair,
            "collapse_rate": (0.02, 0.0),
            "gdpo_cancel_rate": (0.0, 0.0),
            "tokens_last": (1.0, 0.0),
            "per_seed_correct_last": per_seed,
            "correct_collapse_steps": [120, 130, 140] if correct <= 0.05 else [None] * n,
        }

    return {"grpo": method(grpo_correct), "gdpo": method(gdpo_correct)}


def test_report_prose_follows_the_numbers():
    compare = _load_compare()
    table = {
        "A": _fake_table(0.90, 0.91),
        "C": _fake_table(0.02, 0.90, extra="brevity"),
        "D": _fake_table(0.60, 0.92, extra="judge"),
    }
    lines, matches = compare.findings(table)
    assert matches == {"A": True, "C": True, "D": True}
    assert "no difference beyond seed noise" in lines[0]
    assert (
        "GRPO's correct fell to 0.020" in lines[1] and "3/3 seeds" in lines[1] and "step 120–140" in lines[1]
    )
    assert "0.600 (GRPO) vs 0.920 (GDPO), a clear difference" in lines[2]
    assert compare.conclusion(table, matches).startswith("GDPO's win is scale invariance")

    # Numbers that contradict the note are reported as such, and the conclusion does not claim the win.
    table = {
        "A": _fake_table(0.60, 0.90),
        "C": _fake_table(0.85, 0.86, extra="brevity"),
        "D": _fake_table(0.90, 0.91, extra="judge"),
    }
    lines, matches = compare.findings(table)
    assert matches == {"A": False, "C": False, "D": False}
    assert all("contradicts the note" in line for line in lines)
    assert "a clear difference (Δ = +0.300)" in lines[0]
    assert "fell to" not in lines[1]
    assert not compare.conclusion(table, matches).startswith("GDPO's win is scale invariance")
