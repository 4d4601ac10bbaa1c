"""A JSONL line that does not parse is reported at its own line and column, and a line cut short (a
missing ``}``) says so, instead of "column 1" of the line after it."""

from __future__ import annotations

from relax.rollout.prompt_files import read_rows


def _reasons(path):
    rows, unit = read_rows(path)
    assert unit == "line"
    return {number: getattr(row, "reason", None) for number, row in rows}


def test_a_missing_closing_brace_and_a_missing_comma_are_placed_on_their_own_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "1+2=", "label": 3\n{"prompt": "1+3=" "label": 4}\n{"prompt": "2+2=", "label": 4}\n')
    reasons = _reasons(path)
    assert reasons[1] == ("not valid JSON (Expecting ',' delimiter at the end of the line, column 30: is a closing "
                          "} or ] missing?)")
    assert reasons[2] == "not valid JSON (Expecting ',' delimiter at column 19)"  # before "label"
    assert reasons[3] is None  # a good row
