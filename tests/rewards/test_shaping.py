"""relax.rewards.shaping: composable format and length terms."""

from __future__ import annotations

import pytest

from relax.rewards import shaping

FORMAT = shaping.format_match(r"<think>.*?</think>\s*<answer>.*?</answer>")


def test_format_match_is_a_full_match():
    assert FORMAT("p", " <think>a</think>\n<answer>1</answer>\n", None, {}) == {"format": 1.0}
    assert FORMAT("p", "<think>a</think><answer>1</answer> more", None, {}) == {"format": 0.0}
    assert FORMAT("p", "<answer>1</answer>", None, {}) == {"format": 0.0}


def test_length_budget_is_linear_then_zero():
    budget = shaping.length_budget(10)
    assert [budget("p", "x" * n, None, {})["length"] for n in (0, 4, 10, 25)] == [1.0, 0.6, 0.0, 0.0]
    with pytest.raises(ValueError, match="max_chars"):
        shaping.length_budget(0)


def test_combine_named_and_renamed():
    exact = shaping.named(lambda p, c, l, m: float(c.strip() == l), "exact")
    reward = shaping.combine(shaping.renamed(exact, exact="correctness"), FORMAT, shaping.length_budget(100))
    out = reward("p", "<think>t</think><answer>7</answer>", "7", {})
    assert out == {"correctness": 0.0, "format": 1.0, "length": pytest.approx(1 - 34 / 100)}
    assert reward("p", "7", "7", {})["correctness"] == 1.0


def test_combine_refuses_duplicate_keys_and_plain_numbers():
    with pytest.raises(ValueError, match="'format' is returned by two functions"):
        shaping.combine(FORMAT, FORMAT)("p", "x", None, {})
    with pytest.raises(TypeError, match="named"):
        shaping.combine(lambda p, c, l, m: 1.0)("p", "x", None, {})
    with pytest.raises(KeyError, match="nope"):
        shaping.renamed(FORMAT, nope="x")("p", "x", None, {})
