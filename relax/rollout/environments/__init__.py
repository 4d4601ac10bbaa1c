"""Multi-turn rollouts: the environment contract, the turn loop and the built-in environments.

``--env-path package.module:Class`` names a user's environment (``Environment``); a built-in task
may bring its own (``--task calculator``). ``episode_runner(config)`` is what the rollout worker,
the evaluation and the recipes hand to ``sample_groups``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from relax.importing import load_attribute
from relax.rollout.environments.base import Environment, EnvStep
from relax.rollout.environments.calls import EpisodeError

ENV_FLAG = "--env-path"


def load_environment(spec: str) -> Callable[[], Any]:
    """The ``--env-path`` class (or any callable returning a fresh environment)."""
    obj = load_attribute(spec, ENV_FLAG, expected="'package.module:ClassName', e.g. 'my_envs:TwoTurn'")
    if not callable(obj):
        raise ValueError(f"{ENV_FLAG} {spec!r} is a {type(obj).__name__}, not a class")  # noqa: TRY004 - a flag's value
    if isinstance(obj, type) and not callable(getattr(obj, "step", None)):
        raise ValueError(f"{ENV_FLAG} {spec!r}: class {obj.__name__} has no step(completion) method; see "  # noqa: TRY004
                         "relax.rollout.Environment")
    return obj


def environment_source(config) -> tuple[str, Callable[[], Any]] | None:
    """``(name, factory)`` of the run's environment: ``--env-path``, else the built-in task's own
    (only when the run uses the task's prompts), else None (single-turn)."""
    if config.env_path:
        return config.env_path, load_environment(config.env_path)
    if config.prompt_data or config.hf_checkpoint:
        return None
    from relax.rollout.tasks import get_task

    task = get_task(config.task)
    if task.make_env is None:
        return None
    return f"the {task.name} task's environment", task.make_env


def is_multi_turn(config) -> bool:
    """Does the run sample episodes (and so write the attention-mask field)? Loads nothing."""
    if config.env_path:
        return True
    if config.prompt_data or config.hf_checkpoint:
        return False
    from relax.rollout.tasks import get_task

    return get_task(config.task).make_env is not None


def episode_runner(config):
    """The run's ``EpisodeRunner`` (``--max-turns``, ``--env-timeout``), or None for single-turn runs."""
    source = environment_source(config)
    if source is None:
        return None
    from relax.rollout.environments.episodes import EpisodeRunner

    name, make_env = source
    return EpisodeRunner(make_env=make_env, env_name=name, max_turns=config.max_turns, timeout=config.env_timeout)


__all__ = ["ENV_FLAG", "EnvStep", "Environment", "EpisodeError", "environment_source", "episode_runner",
           "is_multi_turn", "load_environment"]
