"""Built-in tasks by name: prompt source, reward function, reward keys, tokenizer and engine.

``get_task("addition")`` is the embedded default of ``relax train`` (no model or data named);
``get_task("reasoning-gym:<dataset>")`` a reasoning-gym task for a Hugging Face model.
"""

from __future__ import annotations

import functools

from relax.rollout.tasks import addition, calculator
from relax.rollout.tasks.task import Task


def _calculator_tokenizer():
    from relax.models.tiny.calculator import CalculatorTokenizer

    return CalculatorTokenizer()


def _addition_task(name: str, components: tuple[str, ...], description: str) -> Task:
    return Task(
        name=name,
        description=description,
        reward_keys=components,
        reward_fn=addition.make_reward_fn(components),
        make_prompts=addition.AdditionPrompts,
        held_out=addition.held_out_problems,
    )


BUILTIN_TASKS: tuple[Task, ...] = (
    _addition_task("addition", addition.BASE_COMPONENTS, "single-digit addition, 4 reward components"),
    _addition_task(
        "addition-brevity",
        addition.BASE_COMPONENTS + ("brevity",),
        "addition plus a brevity component (1 - len/8 if it stops) that conflicts with two-digit answers",
    ),
    _addition_task(
        "addition-judge",
        addition.BASE_COMPONENTS + ("judge",),
        "addition plus a reproducible coin-flip 'judge' component that carries no signal",
    ),
    Task(  # multi-turn: relax.rollout.tasks.calculator, docs/en/multi-turn.md
        name="calculator",
        description="two-digit addition with a calculator tool the model learns to call (multi-turn)",
        reward_keys=calculator.REWARD_KEYS,
        reward_fn=calculator.score_answer,
        make_prompts=calculator.CalculatorPrompts,
        make_tokenizer=_calculator_tokenizer,
        make_engine=calculator.make_engine,
        max_new_tokens=calculator.MAX_NEW_TOKENS,
        held_out=calculator.held_out_problems,
        make_env=calculator.CalculatorEnv,
    ),
)
_BY_NAME = {t.name: t for t in BUILTIN_TASKS}


def task_names() -> tuple[str, ...]:
    return tuple(_BY_NAME)


@functools.lru_cache(maxsize=16)
def _reasoning_gym_task(dataset: str) -> Task:
    from relax.rollout.tasks import reasoning_gym

    return reasoning_gym.make_task(dataset)


def get_task(name: str) -> Task:
    """A built-in task, or ``reasoning-gym:<dataset>`` (relax.rollout.tasks.reasoning_gym)."""
    if name.startswith("reasoning-gym:"):
        return _reasoning_gym_task(name.removeprefix("reasoning-gym:"))
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(
            f"unknown task {name!r} (--task); built-in tasks: {', '.join(_BY_NAME)}, or "
            "reasoning-gym:<dataset> (with the rewards extra)"
        ) from None


__all__ = ["BUILTIN_TASKS", "Task", "get_task", "task_names"]
