"""Small reward functions and the glue to combine them into one ``--custom-rm-path`` function.

Every function here has the reward contract ``fn(prompt, completion, label, metadata)`` and returns
named components, so they compose::

    from relax.rewards import math, shaping

    reward = shaping.combine(
        math.make_score(answer_tag="answer"),
        shaping.format_match(r"<think>.*?</think>\\s*<answer>.*?</answer>", key="format"),
        shaping.length_budget(2000, key="length"),
    )

then ``--custom-rm-path my_module:reward --reward-keys correct format length``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

RewardFn = Callable[[str, str, Any, Mapping], Any]


def _components(fn: RewardFn, value: Any) -> Mapping[str, Any]:
    if isinstance(value, Mapping):
        return value
    name = getattr(fn, "__qualname__", repr(fn))
    raise TypeError(
        f"relax.rewards.shaping.combine: {name} returned {type(value).__name__}, not a mapping of named "
        "components; wrap it with shaping.named(fn, 'key') first"
    )


def combine(*fns: RewardFn) -> RewardFn:
    """One reward function returning the components of all ``fns`` (a key returned twice is an error)."""
    if not fns:
        raise ValueError("relax.rewards.shaping.combine needs at least one reward function")

    def reward(prompt: str, completion: str, label: Any, metadata: Mapping) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for fn in fns:
            for key, value in _components(fn, fn(prompt, completion, label, metadata)).items():
                if key in out:
                    raise ValueError(
                        f"relax.rewards.shaping.combine: component {key!r} is returned by two functions; "
                        "rename one with shaping.renamed(fn, old='new')"
                    )
                out[key] = value
        return out

    return reward


def named(fn: RewardFn, key: str) -> RewardFn:
    """``fn`` (returning one number) as a function returning ``{key: number}``."""

    def reward(prompt: str, completion: str, label: Any, metadata: Mapping) -> dict[str, Any]:
        return {key: fn(prompt, completion, label, metadata)}

    return reward


def renamed(fn: RewardFn, **new_names: str) -> RewardFn:
    """``fn`` with some components renamed: ``renamed(math.score, correct="correctness")``; the other
    components keep their names."""

    def reward(prompt: str, completion: str, label: Any, metadata: Mapping) -> dict[str, Any]:
        value = _components(fn, fn(prompt, completion, label, metadata))
        missing = set(new_names) - set(value)
        if missing:
            raise KeyError(f"relax.rewards.shaping.renamed: {sorted(missing)} not among {sorted(value)}")
        return {new_names.get(k, k): v for k, v in value.items()}

    return reward


def format_match(pattern: str, *, key: str = "format", flags: int = re.DOTALL) -> RewardFn:
    """1.0 when the whole completion (surrounding whitespace aside) matches ``pattern``, else 0.0."""
    compiled = re.compile(pattern, flags)

    def reward(prompt: str, completion: str, label: Any, metadata: Mapping) -> dict[str, float]:
        return {key: float(compiled.fullmatch(completion.strip()) is not None)}

    return reward


def length_budget(max_chars: int, *, key: str = "length") -> RewardFn:
    """1.0 for an empty completion, falling linearly to 0.0 at ``max_chars`` characters and beyond:
    ``max(0, 1 - len / max_chars)``. Characters, not tokens: reward functions see text only."""
    if max_chars <= 0:
        raise ValueError(f"length_budget: max_chars must be > 0, got {max_chars}")

    def reward(prompt: str, completion: str, label: Any, metadata: Mapping) -> dict[str, float]:
        return {key: max(0.0, 1.0 - len(completion) / max_chars)}

    return reward
