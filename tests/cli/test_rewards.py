"""Reward functions: loading from --custom-rm-path, sync/async calls, and the [N, K] checks."""

from __future__ import annotations

import asyncio
import math
import sys
import textwrap

import numpy as np
import pytest
import torch

from relax.rollout.rewards import (
    RewardError,
    call_reward_function,
    load_reward_function,
    reward_matrix,
    score,
)

PROMPTS = ["1+1=", "2+2=", "3+3="]
COMPLETIONS = ["2", "5", "6"]
LABELS = ["2", "4", "6"]
META = [{}, {}, {"hard": True}]


def components(prompt, completion, label, metadata):
    return {
        "format": 0.5 if completion.isdigit() else 0.0,
        "correct": float(completion == label),
        "extra": "x",
    }


def test_matrix_in_reward_keys_order():
    m = score(components, PROMPTS, COMPLETIONS, LABELS, META, ["correct", "format"])
    assert m.dtype == torch.float64 and m.shape == (3, 2)
    assert m.tolist() == [[1.0, 0.5], [0.0, 0.5], [1.0, 0.5]]


def test_plain_number_is_the_reward_component():
    def length(prompt, completion, label, metadata):
        return len(completion) + (0.25 if metadata.get("hard") else 0)

    m = score(length, PROMPTS, COMPLETIONS, LABELS, META, ["reward"])
    assert m.tolist() == [[1.0], [1.0], [1.25]]
    assert reward_matrix([np.float32(1.5), torch.tensor(2.0), 3], ["reward"]).tolist() == [
        [1.5],
        [2.0],
        [3.0],
    ]


def test_async_function():
    async def slow(prompt, completion, label, metadata):
        await asyncio.sleep(0.01 * (3 - len(prompt) % 3))
        return {"correct": float(completion == label)}

    assert score(slow, PROMPTS, COMPLETIONS, LABELS, META, ["correct"]).tolist() == [[1.0], [0.0], [1.0]]

    async def inside_a_running_loop():  # e.g. an async Ray actor: asyncio.run is not allowed there
        return score(slow, PROMPTS, COMPLETIONS, LABELS, META, ["correct"])

    assert asyncio.run(inside_a_running_loop()).tolist() == [[1.0], [0.0], [1.0]]


@pytest.mark.parametrize("asynchronous", [False, True])
def test_raising_function_names_sample_and_function(asynchronous):
    def fails_on_second(prompt, completion, label, metadata):
        if completion == "5":
            raise ZeroDivisionError("boom")
        return 1.0

    fn = fails_on_second
    if asynchronous:

        async def fails_async(prompt, completion, label, metadata):
            return fails_on_second(prompt, completion, label, metadata)

        fn = fails_async
    with pytest.raises(
        RewardError, match=rf"sample 1: reward function .*{fn.__name__} raised ZeroDivisionError: boom"
    ) as info:
        score(fn, PROMPTS, COMPLETIONS, LABELS, META, ["reward"])
    assert isinstance(info.value.__cause__, ZeroDivisionError)


@pytest.mark.parametrize(
    "bad, message",
    [
        ("good", "returned 'good' of type str; expected a number or a mapping"),
        (None, "returned None of type NoneType"),
        (
            {"correct": 1.0},
            "returned no component 'format' (it returned: correct); "
            "the configured reward keys are correct, format",
        ),
        ({"correct": 1.0, "format": True}, "returned 'format' = True, a bool"),
        (
            {"correct": 1.0, "format": np.bool_(False)},
            "returned 'format' = " + repr(np.bool_(False)) + ", a bool",
        ),
        ({"correct": 1.0, "format": "0.5"}, "returned 'format' = '0.5' of type str; expected a real number"),
        ({"correct": math.nan, "format": 1.0}, "returned 'correct' = nan, which is not finite"),
        ({"correct": math.inf, "format": 1.0}, "returned 'correct' = inf, which is not finite"),
        ({"correct": -1e39, "format": 1.0}, "returned 'correct' = -1e+39, which overflows float32"),
        (True, "returned 'reward' = True, a bool"),
    ],
)
def test_bad_values_name_sample_function_key_and_value(bad, message):
    def judge(prompt, completion, label, metadata):
        return bad if completion == "6" else {"correct": 0.0, "format": 0.0, "reward": 0.0}

    with pytest.raises(RewardError) as info:
        score(judge, PROMPTS, COMPLETIONS, LABELS, META, ["reward"] if bad is True else ["correct", "format"])
    text = str(info.value)
    assert text.startswith("sample 2: reward function ") and "judge" in text
    assert message in text


def test_float32_max_itself_is_accepted():
    big = float(torch.finfo(torch.float32).max)
    assert reward_matrix([big, -big], ["reward"]).tolist() == [[big], [-big]]


@pytest.fixture
def reward_module(tmp_path, monkeypatch):
    (tmp_path / "relax_cli_test_rewards.py").write_text(
        textwrap.dedent(
            """
        LIMIT = 3

        def score(prompt, completion, label, metadata):
            return float(completion == label)

        def two_args(prompt, completion):
            return 0.0
        """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "relax_cli_test_rewards"
    sys.modules.pop("relax_cli_test_rewards", None)


def test_load_reward_function(reward_module):
    assert load_reward_function(f"{reward_module}:score")("p", "2", "2", {}) == 1.0
    assert load_reward_function(f"{reward_module}.score").__name__ == "score"  # upstream dotted form


@pytest.mark.parametrize(
    "spec, message",
    [
        ("", "--custom-rm-path needs 'package.module:function'"),
        ("nodots", "--custom-rm-path 'nodots' is malformed"),
        ("no_such_module_xyz:score", "cannot import module 'no_such_module_xyz'"),
        (
            "relax_cli_test_rewards:missing",
            "has no attribute 'missing'. Its public callables: score, two_args",
        ),
        ("relax_cli_test_rewards:LIMIT", "'LIMIT' is a int, not a function"),
        ("relax_cli_test_rewards:two_args", "must accept (prompt, completion, label, metadata)"),
    ],
)
def test_load_errors(reward_module, spec, message):
    with pytest.raises(ValueError) as info:
        load_reward_function(spec)
    assert message in str(info.value)


def test_inputs_must_align():
    with pytest.raises(ValueError, match="equally long inputs"):
        call_reward_function(components, PROMPTS, COMPLETIONS[:2], LABELS, META)
