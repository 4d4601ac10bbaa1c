"""The built-in addition task: reward components by hand, the prompt stream, the registry."""

from __future__ import annotations

import pytest

from relax.rollout.tasks import get_task, task_names
from relax.rollout.tasks.addition import (
    HELD_OUT,
    AdditionPrompts,
    all_problems,
    make_reward_fn,
    score_components,
)

ALL = ("correct", "digits", "format", "length", "brevity")

# (completion, label, correct, digits, format, length, brevity) -- computed by hand from the
# definitions in relax/rollout/tasks/addition.py. ideal length = digits(label) + 3.
CASES = [
    ("<a>7</a><eos>", 7, 1, 1, 1, 1, 1 - 4 / 8),  # the target
    ("<a>15</a><eos>", 15, 1, 1, 1, 1, 1 - 5 / 8),  # two-digit target, ideal 5
    ("<a>7</a>", 7, 1, 1, 0.75, 0, 0),  # never stops
    ("<a>7</a>7777", 7, 1, 1, 0.75, 0, 0),  # runs on to 8 tokens, no <eos>
    ("7</a><eos>", 7, 1, 1, 0.75, 1 - 1 / 4, 1 - 3 / 8),  # opening tag missing
    ("<a>7<eos>", 7, 1, 1, 0.25, 1 - 1 / 4, 1 - 3 / 8),  # closing tag missing
    ("</a>7<a><eos>", 7, 1, 1, 0, 1, 1 - 4 / 8),  # tags swapped: no </a> after the <a>
    ("<a>5</a><eos>", 15, 0, 0.5, 1, 1 - 1 / 5, 1 - 4 / 8),  # two-digit answer, one digit right (right-aligned)
    ("<a>25</a><eos>", 15, 0, 0.5, 1, 1, 1 - 5 / 8),  # tens wrong, units right
    ("<a>115</a><eos>", 15, 0, 1, 1, 1 - 1 / 5, 1 - 6 / 8),  # extra leading digit
    ("<a>1</a><eos>", 15, 0, 0, 1, 1 - 1 / 5, 1 - 4 / 8),  # the tens digit in the units place
    ("<a></a><eos>", 7, 0, 0, 0.75, 1 - 1 / 4, 1 - 3 / 8),  # empty answer: "only digits inside" needs a digit
    ("<eos>", 7, 0, 0, 0, 1 - 3 / 4, 1 - 1 / 8),  # stops at once
    ("", 7, 0, 0, 0, 0, 0),  # nothing at all
    ("<a>07</a><eos>", 7, 0, 1, 1, 1 - 1 / 4, 1 - 5 / 8),  # leading zero: not the answer's digits
    ("3<a>7</a><eos>", 7, 0, 0, 0.75, 1 - 1 / 4, 1 - 5 / 8),  # first digit run is "3"
    ("<a>7+</a><eos>", 7, 1, 1, 0.75, 1 - 1 / 4, 1 - 5 / 8),  # non-digit inside the tags
    ("<a>7</a><a><eos>", 7, 1, 1, 0.75, 1 - 1 / 4, 1 - 5 / 8),  # <eos> not right after </a>
    ("<a>7</a><eos>9</a>", 7, 1, 1, 1, 1, 1 - 4 / 8),  # tokens after <eos> are ignored
    ("<a>0</a><eos>", 0, 1, 1, 1, 1, 1 - 4 / 8),  # zero
    ("<a>18</a><eos><eos>", 18, 1, 1, 1, 1, 1 - 5 / 8),
    ("<a>1<pad>8</a><eos>", 18, 0, 0, 0.75, 1 - 1 / 5, 1 - 6 / 8),  # a sampled <pad> breaks the digit run
]


@pytest.mark.parametrize("completion,label,correct,digits,fmt,length,brevity", CASES)
def test_components_by_hand(completion, label, correct, digits, fmt, length, brevity):
    got = score_components("<bos>3+4=", completion, label, {}, ALL)
    assert got == pytest.approx(
        {"correct": correct, "digits": digits, "format": fmt, "length": length, "brevity": brevity}, abs=1e-12
    )
    assert all(0.0 <= v <= 1.0 for v in got.values())


def test_reward_fn_signature_and_keys():
    task = get_task("addition")
    assert task.reward_keys == ("correct", "digits", "format", "length")
    out = task.reward_fn("<bos>9+9=", "<a>18</a><eos>", 18, {"seed": 0, "index": 3})
    assert list(out) == list(task.reward_keys) and out["correct"] == 1.0
    assert get_task("addition-brevity").reward_keys[-1] == "brevity"
    assert get_task("addition-judge").reward_keys[-1] == "judge"
    assert set(task_names()) >= {"addition", "addition-brevity", "addition-judge"}


def test_unknown_names_and_bad_labels():
    with pytest.raises(KeyError, match="unknown task 'adition'.*addition"):
        get_task("adition")
    with pytest.raises(KeyError, match="unknown addition reward component 'speed'"):
        make_reward_fn(("correct", "speed"))
    with pytest.raises(ValueError, match="non-negative integer label, got None"):
        score_components("<bos>1+1=", "<a>2</a><eos>", None, {})
    with pytest.raises(ValueError, match="non-negative integer label"):
        score_components("<bos>1+1=", "<a>2</a><eos>", True, {})
    assert score_components("<bos>1+1=", "<a>2</a><eos>", "2", {})["correct"] == 1.0


def test_judge_is_a_reproducible_fair_coin():
    fn = make_reward_fn(("correct", "judge"))
    prompts = AdditionPrompts(seed=5).next_batch(400)
    coins = [fn(p.text, "<a>7</a><eos>", p.label, p.metadata)["judge"] for p in prompts]
    again = [fn(p.text, "<a>7</a><eos>", p.label, p.metadata)["judge"] for p in prompts]
    assert coins == again and set(coins) == {0.0, 1.0}
    assert 0.4 < sum(coins) / len(coins) < 0.6
    # same completion, different sample_index -> independent coins
    p = prompts[0]
    by_sample = [fn(p.text, "<a>7</a><eos>", p.label, {**p.metadata, "sample_index": i})["judge"] for i in range(64)]
    assert 0.25 < sum(by_sample) / 64 < 0.75
    # the judge does not look at quality: correct and judge are unrelated here
    assert fn(p.text, "<a>7</a><eos>", p.label, p.metadata)["correct"] in (0.0, 1.0)


def test_prompt_stream_is_seeded_and_resumable():
    a = AdditionPrompts(seed=11)
    first = a.next_batch(5)
    state = a.state_dict()
    rest = a.next_batch(7)
    b = AdditionPrompts(seed=0)
    b.load_state_dict(state)
    assert b.next_batch(7) == rest
    assert AdditionPrompts(seed=11).next_batch(12) == first + rest
    assert AdditionPrompts(seed=12).next_batch(12) != first + rest
    for p in first + rest:
        a_, b_ = p.metadata["a"], p.metadata["b"]
        assert p.text == f"<bos>{a_}+{b_}=" and p.label == a_ + b_ and 0 <= a_ <= 9 and 0 <= b_ <= 9


def test_prompt_stream_covers_all_training_problems():
    seen = {(p.metadata["a"], p.metadata["b"]) for p in AdditionPrompts(seed=1).next_batch(2000)}
    assert len(seen) == 80 and not seen & HELD_OUT  # the 20 held-out problems are never drawn
    assert [p.label for p in all_problems()][:12] == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2]
