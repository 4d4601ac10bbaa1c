"""The environment contract of multi-turn rollouts.

An episode starts from one prompt row and alternates model turns and environment turns in one
token sequence::

    env = MyEnv()                      # one instance per episode, built with no arguments
    env.reset({"prompt": ..., "label": ..., "metadata": {...}})
    step = env.step(completion)        # the model's latest turn, as text
    # -> EnvStep(observation, done, rewards, info)

``observation`` (text, or None for nothing) is appended as the environment's turn and the model
answers it; ``done`` ends the episode (so does ``--max-turns``); ``rewards`` maps reward component
names to numbers (``--reward-keys`` picks and orders them, exactly like a reward function's
components); ``info`` is free-form and logged with the episode (``info["tool_calls"]``, an int, is
counted in ``rollout/tool_calls_mean``). ``reset`` and ``step`` may be plain methods or coroutines.

An episode's reward for component ``k`` is the **sum** of ``rewards[k]`` over its steps (an
environment that only rewards its final step gets that step's value). A component that no step of
an episode ended by ``done`` reported is an error; an episode cut short by ``--max-turns`` (or the
model's context length) before its environment said ``done`` scores 0 for the components it never
reported.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any

import attrs


@attrs.frozen(kw_only=True)
class EnvStep:
    observation: str | None = None
    done: bool = False
    rewards: Mapping[str, float] | None = None
    info: Mapping[str, Any] = attrs.field(factory=dict)


class Environment(abc.ABC):
    """Subclass this (or write any class with the same two methods) and pass
    ``--env-path package.module:YourClass``."""

    def reset(self, sample: Mapping[str, Any]) -> None:
        """Start an episode on ``sample`` = ``{"prompt", "label", "metadata"}`` of one prompt row."""

    @abc.abstractmethod
    def step(self, completion: str) -> EnvStep:
        """React to the model's turn ``completion``."""


__all__ = ["EnvStep", "Environment"]
