"""The start-up figures the README and the async guide quote for a busy machine come from one committed
measurement, ``benchmarks/results/startup_loaded.json`` (date, machine and load beside the numbers), so a
re-measurement cannot leave a page behind, and no page quotes them without the load."""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS = json.loads((REPO / "benchmarks" / "results" / "startup_loaded.json").read_text())


def _figure(run: str) -> str:
    return f"{RESULTS['runs'][run]['startup_s']:g} s"


def test_the_measurement_says_when_where_and_under_what_load():
    assert RESULTS["date"] and RESULTS["machine"] and RESULTS["load_average"]
    assert all("startup_s" in run for run in RESULTS["runs"].values())


def test_the_pages_quote_the_measurement_with_its_load():
    load = RESULTS["load_average"].split(" ")[0]  # e.g. "10.4-14.4"
    cold, warm = _figure("cold (own Ray)"), _figure("--ray-address on relax cluster up (pre-started workers)")
    readme = (REPO / "README.md").read_text()
    assert cold in readme and warm in readme and load in readme
    assert _figure("--in-process") in readme
    for lang in ("en", "zh"):
        page = (REPO / "docs" / lang / "async.md").read_text()
        assert cold in page and warm in page and load in page, f"docs/{lang}/async.md"
        assert "startup_loaded.json" in page
