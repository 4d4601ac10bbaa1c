"""Reward function of the GSM8K-style GDPO recipe: three components for GDPO to normalize separately.

Use it with ``--custom-rm-path examples.gdpo.gsm8k.reward:reward --reward-keys correctness format
integer``. Each component is 0.0 or 1.0 and they are judged independently of each other (a correct
number without the ``<think>`` block still scores ``correctness``), so that each one carries its own
signal:

- ``correctness``: ``relax.rewards.math`` (math-verify) finds the answer inside the first
  ``<answer>…</answer>`` equal to the label's final number. The label may be a raw GSM8K answer
  (worked solution ending in ``#### 42``) or just the number. Equality is mathematical: ``17.0``,
  ``$17``, ``17 apples`` and ``\\frac{34}{2}`` all equal 17, thousands separators (``1,234``) and a
  sign are understood; a completion without the tags has no answer and scores 0.
- ``format``: the whole completion is ``<think>…</think>`` followed by ``<answer>…</answer>``, each
  tag exactly once, a non-empty answer, and nothing but whitespace around them.
- ``integer``: the answer is written as a bare integer (optionally signed, optionally with thousands
  separators): ``42`` and ``1,234`` yes, ``42.0``, ``42.5`` and ``42 apples`` no.

A label without a final number is a data error and raises ``ValueError`` (it would otherwise teach
the model that every answer is wrong). ``correctness`` needs the ``rewards`` extra (math-verify).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from relax.rewards import math as math_rewards

PROMPT_SUFFIX = (
    "\n\nReason step by step inside <think> </think> tags, then write only the final number "
    "inside <answer> </answer> tags."
)

REWARD_KEYS = ("correctness", "format", "integer")

_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
# Tempered tokens: the think and answer bodies may not contain another tag of their own kind.
_FORMAT_RE = re.compile(
    r"\s*<think>(?:(?!</?think>).)*</think>\s*<answer>((?:(?!</?answer>).)*)</answer>\s*",
    re.DOTALL,
)
# A number: optional sign, digits with optional thousands separators (groups of exactly three),
# optional decimal part.
_NUMBER_RE = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_INTEGER_RE = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)")


def parse_number(text: str) -> Decimal | None:
    """The number written in ``text`` (whitespace around it allowed), or ``None`` if it is not one."""
    text = text.strip()
    if not _NUMBER_RE.fullmatch(text):
        return None
    try:
        return Decimal(text.replace(",", ""))
    except InvalidOperation:  # pragma: no cover - the regex admits only valid decimals
        return None


def label_number(label: Any) -> Decimal:
    """The final number of a label: the text after the last ``####`` if present, else the label."""
    if isinstance(label, bool) or label is None:
        raise ValueError(f"GSM8K label must be a number or a string ending in '#### N', got {label!r}")
    text = str(label)
    if "####" in text:
        text = text.rsplit("####", 1)[1]
    number = parse_number(text)
    if number is None:
        raise ValueError(
            f"GSM8K label {str(label)[-80:]!r} has no final number (expected a number, or a worked "
            "answer ending in '#### N'); fix the row or choose another --label-key"
        )
    return number


def extract_answer(completion: str) -> str | None:
    """The text inside the first ``<answer>…</answer>``, or ``None`` when there is none."""
    match = _ANSWER_RE.search(completion)
    return match.group(1) if match else None


_correct = math_rewards.make_score(answer_tag="answer")


def reward(prompt: str, completion: str, label: Any, metadata: Mapping) -> dict[str, float]:
    """``{"correctness", "format", "integer"}``, each 0.0 or 1.0 (see the module docstring)."""
    label_number(label)  # a label without a final number stops the run with this recipe's message
    answer = extract_answer(completion)
    format_match = _FORMAT_RE.fullmatch(completion)
    return {
        "correctness": _correct(prompt, completion, label, metadata)["correct"],
        "format": float(format_match is not None and format_match.group(1).strip() != ""),
        "integer": float(answer is not None and _INTEGER_RE.fullmatch(answer.strip()) is not None),
    }
