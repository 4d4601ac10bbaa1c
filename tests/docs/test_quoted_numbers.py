"""The held-out accuracies the docs quote for the embedded default come from one measurement, the
table in docs/en/embedded-default.md: the README's quick start (GDPO) and the evaluation / tracking
guides' plain ``relax train`` (GRPO) quote that table's numbers, in both languages, so that one
re-measurement cannot leave a page behind."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
HELD_OUT_LINE = re.compile(r"held-out accuracy \(correct, greedy, 20 problems\): ([0-9.]+) -> ([0-9.]+) \(step 0 -> step 450\)")


def measured() -> dict[str, tuple[str, str]]:
    """method -> (before, after): the held-out column of the embedded default's table."""
    table = {}
    for line in (DOCS / "en" / "embedded-default.md").read_text().splitlines():
        row = re.match(r"\s*\| (GDPO|GRPO) \(.*\|\s*([0-9.]+) → ([0-9.]+) \|$", line)
        if row:
            table[row[1]] = (row[2], row[3])
    assert set(table) == {"GDPO", "GRPO"}, "the table of docs/en/embedded-default.md changed shape"
    return table


def quoted(path: Path) -> list[tuple[str, str]]:
    return HELD_OUT_LINE.findall(path.read_text())


def test_the_quick_start_quotes_the_gdpo_measurement():
    assert quoted(REPO / "README.md") == [measured()["GDPO"]]


def test_the_guides_quote_the_grpo_measurement_of_a_plain_relax_train():
    grpo = measured()["GRPO"]
    for lang in ("en", "zh"):
        for page in ("evaluation.md", "tracking.md"):
            assert quoted(DOCS / lang / page) == [grpo], f"docs/{lang}/{page}"


def test_the_chinese_embedded_default_page_quotes_the_same_table():
    text = (DOCS / "zh" / "embedded-default.md").read_text()
    table = measured()
    assert f"留出集贪心准确率 {table['GDPO'][0]} → {table['GDPO'][1]}" in text
    assert f"留出集 {table['GRPO'][0]} → {table['GRPO'][1]}" in text
