"""relax.rewards.math: math-verify equivalence of the final answer, also from a worker thread."""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("math_verify", reason="the rewards extra (math-verify) is not installed")

from relax.rewards import math as math_rewards
from relax.rollout.rewards import load_reward_function
from relax.rollout.rewards import score as score_batch

CORRECT = [
    (r"The answer is $\boxed{\frac{1}{2}}$.", "0.5"),
    ("1/2", r"\frac{1}{2}"),
    (r"so $x = \boxed{2\sqrt{2}}$", r"\sqrt{8}"),
    ("We get 17 apples in total.", "Apples: 14 + 3 = 17\n#### 17"),  # a raw GSM8K answer as the label
    ("Total: 1,234.", "#### 1234"),
]
WRONG = [
    (r"$\boxed{3}$", "4", 1.0),
    ("I cannot tell.", "4", 0.0),  # no answer at all
    (r"first $\boxed{4}$, no: $\boxed{3}$", "4", 1.0),  # the last boxed answer counts
]


@pytest.mark.parametrize("completion, label", CORRECT)
def test_equivalent_answers_are_correct(completion, label):
    assert math_rewards.score("p", completion, label, {}) == {"correct": 1.0, "has_answer": 1.0}


@pytest.mark.parametrize("completion, label, has_answer", WRONG)
def test_wrong_or_missing_answers_score_zero(completion, label, has_answer):
    assert math_rewards.score("p", completion, label, {}) == {"correct": 0.0, "has_answer": has_answer}


def test_answer_tag_restricts_where_the_answer_is_read():
    tagged = math_rewards.make_score(answer_tag="answer")
    assert tagged("p", "<think>maybe 3</think><answer>17</answer>", "17", {})["correct"] == 1.0
    assert tagged("p", "<think>17</think><answer>3</answer>", "17", {})["correct"] == 0.0
    assert tagged("p", "17", "17", {}) == {"correct": 0.0, "has_answer": 0.0}  # no tag: no answer
    assert math_rewards.score("p", "17", "17", {})["correct"] == 1.0  # the untagged score finds it


@pytest.mark.parametrize("label", ["", "  ", "#### ", None, True])
def test_unreadable_label_is_a_data_error(label):
    with pytest.raises(ValueError, match="label"):
        math_rewards.score("p", r"\boxed{1}", label, {})


def test_works_outside_the_main_thread():
    # math-verify's own timeout is signal-based and raises in threads; score must not.
    results, errors = {}, []

    def work():
        try:
            for completion, label in CORRECT:
                results[completion] = math_rewards.score("p", completion, label, {})["correct"]
            results["wrong"] = math_rewards.score("p", r"\boxed{3}", "4", {})["correct"]
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(60)
    assert not errors, errors
    assert results.pop("wrong") == 0.0
    assert set(results.values()) == {1.0} and len(results) == len(CORRECT)


def test_as_custom_rm_path_with_reward_concurrency():
    fn = load_reward_function("relax.rewards.math:score")
    completions = [c for c, _ in CORRECT] + [c for c, _, _ in WRONG]
    labels = [lbl for _, lbl in CORRECT] + [lbl for _, lbl, _ in WRONG]
    matrix = score_batch(fn, ["p"] * len(labels), completions, labels, [{}] * len(labels),
                         ("correct", "has_answer"), concurrency=4)
    assert matrix[:, 0].tolist() == [1.0] * len(CORRECT) + [0.0] * len(WRONG)
    assert matrix[:, 1].tolist() == [1.0] * len(CORRECT) + [1.0, 0.0, 1.0]
