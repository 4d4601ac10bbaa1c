"""Built-in tasks by name: prompt source, reward function, reward keys, tokenizer and engine.

``get_task("addition")`` is the embedded default of ``relax train`` (no model or data named);
``get_task("reasoning-gym:<dataset>")`` a reasoning-gym task for a Hugging Face model.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import attrs

from relax.models.tiny.tokenizer import TinyTokenizer
from relax.rollout.tasks import addition, calculator


def _warmup_engine():
    from relax.models.tiny.weights import load_warmup_model
    from relax.rollout.tiny.engine import TinyEngine

    return TinyEngine(load_warmup_model())


@attrs.frozen(kw_only=True)
class Task:
    name: str
    description: str
    reward_keys: tuple[str, ...]
    reward_fn: Callable  # (prompt, completion, label, metadata) -> {component: float}
    make_prompts: Callable[[int], object]  # seed -> a resumable prompt source (next_batch, state_dict)
    make_tokenizer: Callable[[], TinyTokenizer] = TinyTokenizer
    make_engine: Callable[[], object] = _warmup_engine  # the warm-up model in a TinyEngine
    max_new_tokens: int = addition.MAX_NEW_TOKENS
    # The evaluation set: problems the training stream never draws (None: the task has none).
    held_out: Callable[[], list] | None = None
    # A multi-turn task's environment class (relax.rollout.environments); None: single-turn.
    make_env: Callable[[], object] | None = None
    # A task for Hugging Face models (--hf-checkpoint), whose prompts are formatted with the run's
    # tokenizer and flags: (config, tokenizer) -> prompt source / evaluation prompts. When set, they
    # replace make_prompts / held_out (relax.rollout.factory).
    prompt_source: Callable[[object, object], object] | None = None
    eval_prompts: Callable[[object, object], list] | None = None

    @property
    def needs_hf_checkpoint(self) -> bool:
        return self.prompt_source is not None


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
