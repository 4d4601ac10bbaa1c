"""The environment's pre-flight (``relax train`` runs it before Ray starts): build one environment,
``reset`` it on a real prompt row and ``step`` it once, with the checks and messages of the run."""

from __future__ import annotations

import math
import numbers

from relax.rollout.environments import environment_source
from relax.rollout.environments.base import EnvStep
from relax.rollout.environments.calls import EnvCaller, EpisodeError, raised

PREFLIGHT_TIMEOUT_S = 60.0


def check_environment(config, prompts: list) -> None:
    """``prompts``: ``(where, Prompt)`` pairs of the run's data. Raises ``ValueError`` naming the
    flag, the sample and what went wrong."""
    source = environment_source(config)
    if source is None:
        return
    name, make_env = source
    if config.custom_rm_path:
        raise ValueError(f"--custom-rm-path {config.custom_rm_path} has no effect with {name}: the "
                         "environment's reward components score the episodes; drop one of the two")
    if not prompts:
        return
    where, prompt = prompts[0]
    caller = EnvCaller(name, config.env_timeout or PREFLIGHT_TIMEOUT_S, lambda e: f"pre-flight, {where}")
    try:
        try:
            env = make_env()
        except (Exception, SystemExit) as exc:
            raise EpisodeError(f"environment {name}: building it {raised(exc)}") from exc
        sample = {"prompt": prompt.text, "label": prompt.label, "metadata": dict(prompt.metadata)}
        caller.call("reset", [env], [0], [(sample,)], None)
        # a label-like answer: the environment must accept any text the model may write
        (result,) = caller.call("step", [env], [0], [("" if prompt.label is None else str(prompt.label),)], 1)
    finally:
        caller.close()
    call = caller.where(0, 1, "step")
    if not isinstance(result, EnvStep):
        raise EpisodeError(f"{call} returned {type(result).__name__}; it must return relax.rollout.EnvStep")
    if result.observation is not None and not isinstance(result.observation, str):
        raise EpisodeError(f"{call} returned observation of type {type(result.observation).__name__}")
    for key, value in (result.rewards or {}).items():
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
            raise EpisodeError(f"{call} returned reward {key!r} = {value!r}: not a finite number")
