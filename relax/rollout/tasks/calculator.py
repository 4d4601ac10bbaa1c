"""The built-in multi-turn task ``calculator``: two-digit addition with a calculator tool.

Prompt ``<bos>a+b=`` with a, b in 10..99 (label a + b). Too hard for the tiny model to compute
alone, easy with the tool: the model may call ``<calc>a+b</calc>`` (compact tool syntax,
``relax.rollout.tools``); the environment replies ``<r>sum</r>`` (``<r></r>`` for a call it cannot
evaluate); the model's first turn without a call is its answer ``<a>digits</a><eos>``. The ideal
episode::

    <bos>34+58=  <calc>34+58</calc><eos>  <r>92</r>  <a>92</a><eos>
    prompt       model (turn 1)           env        model (turn 2)

Reward component ``correct``: 1 if the answer's first digit run is the sum exactly, else 0. 90 of
the 8100 problems are held out for evaluation (``held_out_problems``); the training stream never
draws them. Vocabulary and model: ``relax.models.tiny.calculator``.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from typing import Any

from relax.rollout.base import Prompt
from relax.rollout.tools import Tool, ToolEnvironment

MAX_NEW_TOKENS = 8
REWARD_KEYS: tuple[str, ...] = ("correct",)
LOW, HIGH = 10, 99
# 90 problems, each first and each second operand exactly once (7 and 13 are prime to 90)
HELD_OUT = frozenset((LOW + (7 * i) % 90, LOW + (13 * i + 5) % 90) for i in range(90))


def prompt_text(a: int, b: int) -> str:
    return f"<bos>{a}+{b}="


def held_out_problems() -> list[Prompt]:
    return [Prompt(prompt_text(a, b), a + b, {"a": a, "b": b}) for a, b in sorted(HELD_OUT)]


class CalculatorPrompts:
    """A seeded, resumable stream of training problems (uniform over those not held out)."""

    def __init__(self, seed: int = 0):
        self.seed, self.counter = int(seed), 0

    def problem(self, index: int) -> Prompt:
        rng = random.Random(f"relax-calculator:{self.seed}:{index}")
        a, b = rng.randint(LOW, HIGH), rng.randint(LOW, HIGH)
        while (a, b) in HELD_OUT:
            a, b = rng.randint(LOW, HIGH), rng.randint(LOW, HIGH)
        return Prompt(prompt_text(a, b), a + b, {"seed": self.seed, "index": index, "a": a, "b": b})

    def next_batch(self, n: int) -> list[Prompt]:
        prompts = [self.problem(self.counter + i) for i in range(n)]
        self.counter += n
        return prompts

    def state_dict(self) -> dict:
        return {"seed": self.seed, "counter": self.counter}

    def load_state_dict(self, state: Mapping) -> None:
        self.seed, self.counter = int(state["seed"]), int(state["counter"])


_SUM = re.compile(r"^(\d{1,3})\+(\d{1,3})$")


def calculate(expression: str) -> int:
    """``"12+34"`` -> 46: sums of two numbers of at most three digits, nothing else."""
    match = _SUM.match(expression)
    if not match:
        raise ValueError(f"cannot evaluate {expression!r}: the calculator adds two numbers, e.g. 12+34")
    return int(match.group(1)) + int(match.group(2))


CALCULATOR = Tool(name="calc", description="add two numbers, e.g. 12+34", fn=calculate,
                  parameters={"type": "object", "properties": {"expression": {"type": "string"}},
                              "required": ["expression"]})


def score_answer(prompt: str, completion: str, label: Any, metadata: Mapping) -> dict[str, float]:
    """``correct`` of a final answer: its first run of digits equals the label exactly."""
    answer = completion.split("<eos>", 1)[0]
    digits = re.search(r"\d+", answer)
    return {"correct": float(digits is not None and digits.group(0) == str(label))}


class CalculatorEnv(ToolEnvironment):
    """One episode: any number of ``<calc>`` turns (at most 2; ``--max-turns`` bounds it too), then
    the answer, scored by ``score_answer``."""

    tools = (CALCULATOR,)
    syntax = "compact"
    max_tool_turns = 2

    def error_observation(self, message: str) -> str:
        return "<r></r>"  # the tiny vocabulary cannot spell an error message

    def score(self, answer: str) -> dict[str, float]:
        return score_answer(self.sample["prompt"], answer, self.sample["label"], self.sample["metadata"])


def make_engine():
    from relax.models.tiny.calculator import CalculatorTokenizer, load_calculator_model
    from relax.rollout.tiny.engine import TinyEngine

    return TinyEngine(load_calculator_model(), CalculatorTokenizer())
