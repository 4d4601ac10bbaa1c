"""``relax.rewards.math:score``: is the completion's final answer mathematically equal to the label?

Use it with ``--custom-rm-path relax.rewards.math:score --reward-keys correct`` (add ``has_answer``
as a second component, or leave it for the logs). Equivalence is decided by ``math-verify`` (the
``rewards`` extra: ``pip install -e '.[rewards]' torch==2.13.0``), so ``\\boxed{\\frac{1}{2}}``
equals ``0.5``, ``1/2`` equals ``\\frac{1}{2}`` and ``2\\sqrt{2}`` equals ``\\sqrt{8}``. Components:

- ``correct``: 1.0 when the final answer equals the label, else 0.0;
- ``has_answer``: 1.0 when an answer could be found in the completion at all.

The final answer is the last ``\\boxed{...}`` when there is one, else the last number or expression
math-verify finds. ``make_score(answer_tag="answer")`` looks only inside the first
``<answer>...</answer>`` instead (no tag: no answer). The label is LaTeX or plain text; a raw GSM8K
answer (a worked solution ending in ``#### 42``) counts by the text after its last ``####``. A label
math-verify cannot read is a data error and raises ``ValueError`` naming it.

math-verify bounds its own parsing and comparison with ``signal.alarm``, which works only in the main
thread; reward functions run in threads with ``--reward-concurrency`` > 1 or ``--reward-timeout``.
There ``score`` turns math-verify's timeouts off and the bound is ``--reward-timeout`` instead.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from typing import Any

REWARD_KEYS = ("correct", "has_answer")
PARSE_SECONDS = 5  # math-verify's own bound per parse / comparison, in the main thread only


def _math_verify():
    try:
        import math_verify
    except ImportError:
        raise ImportError(
            "relax.rewards.math needs math-verify (the rewards extra): pip install -e '.[rewards]' "
            "torch==2.13.0"
        ) from None
    return math_verify


def _timeout() -> int | None:
    """math-verify's timeout: its signal-based alarm only where signals can be used."""
    return PARSE_SECONDS if threading.current_thread() is threading.main_thread() else None


def _label_text(label: Any) -> str:
    if isinstance(label, bool) or label is None:
        raise ValueError(f"relax.rewards.math: the label must be a number or a string, got {label!r}")
    text = str(label)
    if "####" in text:
        text = text.rsplit("####", 1)[1]
    return text.strip()


def parse_label(label: Any) -> list:
    """math-verify's parse of the label (read as LaTeX math), or ``ValueError`` naming the label."""
    mv = _math_verify()
    text = _label_text(label)
    timeout = _timeout()
    parsed = mv.parse(f"${text}$", parsing_timeout=timeout) if text else []
    if not parsed:
        parsed = mv.parse(text, parsing_timeout=timeout) if text else []
    if not parsed:
        raise ValueError(
            f"relax.rewards.math: label {str(label)[-80:]!r} has no answer math-verify can read (expected a "
            "number or LaTeX expression, or a worked answer ending in '#### N'); fix the row or choose "
            "another --label-key"
        )
    return parsed


def parse_answer(completion: str, answer_tag: str | None = None) -> list:
    """math-verify's parse of the completion's final answer (``[]`` when there is none)."""
    mv = _math_verify()
    text = completion
    if answer_tag is not None:
        match = re.search(rf"<{re.escape(answer_tag)}>(.*?)</{re.escape(answer_tag)}>", completion, re.DOTALL)
        if match is None:
            return []
        text = match.group(1)
    return mv.parse(text, parsing_timeout=_timeout())


def equivalent(answer: list, gold: list) -> bool:
    return bool(answer) and bool(_math_verify().verify(gold, answer, timeout_seconds=_timeout()))


def make_score(*, answer_tag: str | None = None):
    """A ``score`` that reads the answer inside ``<answer_tag>...</answer_tag>`` (None: anywhere)."""

    def score(prompt: str, completion: str, label: Any, metadata: Mapping) -> dict[str, float]:
        gold = parse_label(label)
        answer = parse_answer(completion, answer_tag)
        return {"correct": float(equivalent(answer, gold)), "has_answer": float(bool(answer))}

    score.__qualname__ = score.__name__ = "score"
    return score


score = make_score()
