"""The composition example of docs/{en,zh}/rewards.md runs and scores as the page says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("math_verify", reason="the rewards extra (math-verify) is not installed")

DOCS = Path(__file__).resolve().parents[2] / "docs"
BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def test_both_languages_carry_the_same_example_and_it_runs():
    en, zh = (BLOCK.findall((DOCS / lang / "rewards.md").read_text(encoding="utf-8")) for lang in ("en", "zh"))
    assert len(en) == 1 and en == zh
    namespace: dict = {}
    exec(compile(en[0], "rewards.md", "exec"), namespace)
    reward = namespace["reward"]
    good = "<think>17 - 6</think><answer>11</answer>"
    out = reward("p", good, "#### 11", {})
    assert out == {"correctness": 1.0, "has_answer": 1.0, "format": 1.0, "length": 1 - len(good) / 2000}
    assert reward("p", "<answer>12</answer>", "11", {})["correctness"] == 0.0
    assert reward("p", "<answer>12</answer>", "11", {})["format"] == 0.0
