"""The GSM8K-style recipe's reward function and its bundled data."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # `--custom-rm-path examples.gdpo.gsm8k.reward:reward` imports from the repo root
    sys.path.insert(0, str(REPO))

from examples.gdpo.gsm8k.reward import PROMPT_SUFFIX, REWARD_KEYS, label_number, reward  # noqa: E402

DATA = REPO / "examples" / "gdpo" / "gsm8k" / "data" / "gsm8k_mini.jsonl"
GOOD = "<think>14 + 9 = 23, 23 - 6 = 17</think><answer>17</answer>"


def score(completion, label="#### 17"):
    return reward("prompt", completion, label, {})


def test_well_formed_correct_integer_answer_scores_everything():
    assert score(GOOD) == {"correctness": 1.0, "format": 1.0, "integer": 1.0}
    assert tuple(score(GOOD)) == REWARD_KEYS


@pytest.mark.parametrize(
    "label",
    [
        "Apples picked: 14 + 9 = 23.\nAfter giving some away: 23 - 6 = 17.\n#### 17",  # raw GSM8K answer
        "#### 17",
        "17",
        17,
        " 17\n",
        "The 3 boxes hold #### 17",  # numbers before '####' are ignored
    ],
)
def test_label_forms(label):
    assert score(GOOD, label)["correctness"] == 1.0


def test_only_the_final_number_of_the_label_counts():
    assert score("<think>x</think><answer>23</answer>", "14 + 9 = 23.\n#### 17")["correctness"] == 0.0


@pytest.mark.parametrize(
    "answer, label",
    [("1,234", "#### 1234"), ("1234", "#### 1,234"), ("1,234", "#### 1,234"), ("12,500", "12500")],
)
def test_thousands_separators_on_either_side(answer, label):
    out = score(f"<think>t</think><answer>{answer}</answer>", label)
    assert out["correctness"] == 1.0
    assert out["integer"] == 1.0


def test_malformed_separators_are_not_numbers():
    out = score("<think>t</think><answer>1,23</answer>", "#### 123")
    assert out["correctness"] == 0.0 and out["integer"] == 0.0


@pytest.mark.parametrize("answer, label, correct", [("-7", "#### -7", 1.0), ("7", "#### -7", 0.0), ("-1,500", "-1500", 1.0)])
def test_negative_numbers(answer, label, correct):
    out = score(f"<think>t</think><answer>{answer}</answer>", label)
    assert out["correctness"] == correct
    assert out["integer"] == 1.0


def test_whitespace_inside_and_around_the_tags():
    out = score("\n  <think>\nsteps\n</think>\n\n<answer>  17 \n</answer>\n")
    assert out == {"correctness": 1.0, "format": 1.0, "integer": 1.0}


def test_missing_tags():
    assert score("17") == {"correctness": 0.0, "format": 0.0, "integer": 0.0}
    # answer without think: correct and integer, but not the format
    assert score("<answer>17</answer>") == {"correctness": 1.0, "format": 0.0, "integer": 1.0}
    # think without answer
    assert score("<think>17</think>") == {"correctness": 0.0, "format": 0.0, "integer": 0.0}
    # unclosed answer tag
    assert score("<think>t</think><answer>17") == {"correctness": 0.0, "format": 0.0, "integer": 0.0}


def test_think_must_come_before_answer():
    out = score("<answer>17</answer><think>t</think>")
    assert out == {"correctness": 1.0, "format": 0.0, "integer": 1.0}


@pytest.mark.parametrize(
    "completion",
    [
        "<think>t</think><answer>17</answer> and more text",
        "intro <think>t</think><answer>17</answer>",
        "<think>t</think><answer>17</answer><answer>18</answer>",
        "<think>a<think>b</think><answer>17</answer>",
        "<think>t</think><answer>  </answer>",
    ],
)
def test_format_rejects_extra_text_repeated_tags_and_empty_answers(completion):
    assert score(completion)["format"] == 0.0


def test_first_answer_tag_is_judged():
    out = score("<think>t</think><answer>18</answer><answer>17</answer>")
    assert out["correctness"] == 0.0


# correctness is math-verify's equivalence (relax.rewards.math): units and a currency sign do not change
# the number; integer still wants the bare integer
@pytest.mark.parametrize(
    "answer, correct, integer",
    [("17.0", 1.0, 0.0), ("17.5", 0.0, 0.0), ("$17", 1.0, 0.0), ("17 apples", 1.0, 0.0),
     (r"\frac{34}{2}", 1.0, 0.0), ("18 apples", 0.0, 0.0)],
)
def test_decimals_units_and_words(answer, correct, integer):
    out = score(f"<think>t</think><answer>{answer}</answer>")
    assert (out["correctness"], out["integer"]) == (correct, integer)


@pytest.mark.parametrize("label", ["no number here", "#### ", None, True, "#### forty"])
def test_label_without_a_final_number_is_an_error(label):
    with pytest.raises(ValueError, match="label"):
        score(GOOD, label)


def test_prompt_suffix_states_the_format():
    for tag in ("<think>", "</think>", "<answer>", "</answer>"):
        assert tag in PROMPT_SUFFIX


def test_bundled_data_is_well_formed_and_self_consistent():
    rows = [json.loads(line) for line in DATA.read_text().splitlines()]
    assert len(rows) >= 50
    assert len({r["question"] for r in rows}) == len(rows)
    for i, row in enumerate(rows, start=1):
        assert set(row) == {"question", "answer"}, f"line {i}"
        assert "\n#### " in row["answer"], f"line {i}"
        target = label_number(row["answer"])
        # the worked solution's last computed value is the final answer
        last_step = row["answer"].split("\n#### ")[0].splitlines()[-1]
        assert last_step.rstrip(".").endswith(f"= {int(target)}"), f"line {i}: {last_step!r} vs {target}"
        # and an ideal completion for it scores full marks
        good = f"<think>{row['answer'].split('####')[0]}</think><answer>{row['answer'].split('####')[1]}</answer>"
        assert reward(row["question"], good, row["answer"], {}) == {"correctness": 1.0, "format": 1.0, "integer": 1.0}
