"""The recipe's reward, read through the CPU smoke run's tiny vocabulary (``run_cpu.sh`` only).

The smoke run's random checkpoint has a 50-word tokenizer (``tests/hf/tiny_checkpoints.py``) without
``<`` or ``>``: it can never write ``<think>`` or ``<answer>``, so ``reward.reward`` would give every
completion 0 on every component, no group would carry a signal and the run would train nothing (which
``relax train`` reports as an error). This adapter lets the word ``answer``, which the vocabulary has,
stand in for the tags: the words before the first ``answer`` become the ``<think>`` block and the words
after it the ``<answer>`` block, and ``reward.reward`` scores that text unchanged. A completion without
the word keeps its zeros. Random completions contain the word now and then, so ``format`` (and rarely
``integer``) varies within a group and GDPO has something to normalize: a smoke test of the path, not a
task anyone should train on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from examples.gdpo.gsm8k.reward import REWARD_KEYS, reward as recipe_reward

__all__ = ["REWARD_KEYS", "as_tagged", "reward"]

TAG_WORD = "answer"


def as_tagged(completion: str) -> str:
    """``completion`` with the first word ``answer`` read as ``</think> <answer>`` (see the module)."""
    words = completion.split()
    if TAG_WORD not in words:
        return completion
    cut = words.index(TAG_WORD)
    thinking, answer = " ".join(words[:cut]), " ".join(words[cut + 1:])
    return f"<think>{thinking}</think> <answer>{answer}</answer>"


def reward(prompt: str, completion: str, label: Any, metadata: Mapping) -> dict[str, float]:
    """``reward.reward`` of the tagged reading of ``completion``."""
    return recipe_reward(prompt, as_tagged(completion), label, metadata)
