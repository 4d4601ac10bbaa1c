"""The comparison's reward functions (``--custom-rm-path``): a built-in task's reward with one component
reported on a bigger scale, as when one reward model scores on 0..10 and the others on 0..1.

``examples/gdpo/compare.py`` names them by setting (``SCALED_REWARDS``); e.g. ``brevity_x10`` is the
``addition-brevity`` task's reward with ``brevity`` multiplied by 10 before the algorithm sees it.
"""

from __future__ import annotations

from relax.rollout.tasks import get_task


def scaled(task: str, key: str, factor: float):
    """``task``'s reward function with component ``key`` multiplied by ``factor``."""
    reward_fn = get_task(task).reward_fn

    def reward(prompt, completion, label, metadata):
        values = dict(reward_fn(prompt, completion, label, metadata))
        values[key] = values[key] * factor
        return values

    reward.__name__ = f"{key}_x{factor:g}"
    return reward


length_x10 = scaled("addition", "length", 10)
brevity_x10 = scaled("addition-brevity", "brevity", 10)
judge_x5 = scaled("addition-judge", "judge", 5)
