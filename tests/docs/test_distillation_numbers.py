"""The distillation page quotes the committed demonstration, ``examples/distillation/results/summary.json``
(written by ``examples/distillation/compare.py``), row for row in both languages, so a re-run cannot
leave a page behind; and the summary's comparisons follow from its own curves."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "examples" / "distillation" / "results"
SUMMARY = json.loads((RESULTS / "summary.json").read_text(encoding="utf-8"))


def _compare_script():
    spec = importlib.util.spec_from_file_location("distillation_compare", REPO / "examples" / "distillation" / "compare.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _window(values: dict, steps: int, fraction: float) -> tuple[float, float]:
    width = max(1, round(steps * fraction))
    values = {int(s): v for s, v in values.items()}
    first = [v for s, v in values.items() if s <= width]
    last = [v for s, v in values.items() if s > steps - width]
    return sum(first) / len(first), sum(last) / len(last)


def test_the_summary_says_when_where_and_under_what_load():
    assert SUMMARY["date"] and SUMMARY["machine"] and SUMMARY["load_average"]
    assert SUMMARY["teacher_held_out_accuracy"] >= 0.75  # the teacher the demonstration asks for (>= 0.75)
    assert {run["method"] for run in SUMMARY["runs"].values()} == {"on-policy-distill", "gkd", "grpo"}


def test_the_comparisons_follow_from_the_curves():
    steps, fraction = SUMMARY["steps"], SUMMARY["window_fraction"]
    for run in SUMMARY["runs"].values():
        accuracy = run["held_out_accuracy"]
        assert run["accuracy_first_last_10pct"] == list(_window(accuracy, steps, fraction))
        reached = [s for s, v in sorted(((int(s), v) for s, v in accuracy.items())) if v >= SUMMARY["threshold"]]
        assert run["steps_to_threshold"] == (reached[0] if reached else None)
        if "distill/reverse_kl" in run:
            first, last = _window(run["distill/reverse_kl"], steps, fraction)
            assert run["distill/reverse_kl_first_last_10pct"] == [first, last]
            assert abs(run["distill/reverse_kl_drop"] - (1 - last / first)) < 1e-12


def test_both_pages_quote_every_run_and_the_report_is_the_summarys():
    compare = _compare_script()
    assert (RESULTS / "report.md").read_text(encoding="utf-8") == compare.report(SUMMARY)
    for lang in ("en", "zh"):
        page = (REPO / "docs" / lang / "distillation.md").read_text(encoding="utf-8")
        for name, run in SUMMARY["runs"].items():
            assert compare.table_row(name, run) in page, f"docs/{lang}/distillation.md lacks the row of {name}"
        assert SUMMARY["load_average"] in page  # the machine's load beside the numbers


def test_the_pages_conclusions_hold_in_the_summary():
    """What docs/*/distillation.md concludes from the table (the target set for on-policy-distill)."""
    runs = SUMMARY["runs"].values()
    grpo_best = max(r["accuracy_first_last_10pct"][1] for r in runs if r["method"] == "grpo")
    for run in runs:
        if run["method"] == "grpo":
            assert run["steps_to_threshold"] is None  # "GRPO never reaches 0.5 within the budget"
            continue
        assert run["accuracy_gain"] >= 0.3 and run["distill/reverse_kl_drop"] >= 0.5
        assert run["steps_to_threshold"] is not None and run["accuracy_first_last_10pct"][1] > grpo_best
