"""What ``run(config)`` makes of its argument before anything starts, whoever calls it: the type is
checked, and the defaults ``relax train`` derives from other settings are filled in the same way
(``relax.cli.build``), so that ``run(RunConfig())`` trains the embedded default exactly as a bare
``relax train`` does. The rules (``relax.runtime.checks.validation``) and the pre-flight checks
(``relax.runtime.preflight``) follow in ``run``.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from relax.config.algorithm import AlgorithmConfig
from relax.config.run import RunConfig
from relax.rollout.rewards import SCALAR_REWARD_KEY

_DEFAULT_KEYS = attrs.fields(AlgorithmConfig).reward_keys.default


def _type_error(config) -> TypeError:
    what = type(config).__name__
    if isinstance(config, Mapping):
        keys = ", ".join(f"{k}=..." for k in list(config)[:3])
        return TypeError(
            f"run() takes a RunConfig, got a {what}; build one from it: run(RunConfig({keys})) (the algorithm's "
            "hyper-parameters go in RunConfig(algorithm=AlgorithmConfig(...)))"
        )
    return TypeError(f"run() takes a RunConfig (relax.config.run.RunConfig), got {what}")


def _task_reward_keys(config: RunConfig) -> RunConfig:
    """A ``RunConfig`` left at the scalar default ``reward_keys`` that trains on a built-in task's own
    reward gets the task's components, as ``relax train`` gives it (with a ``--custom-rm-path``
    function or ``--prompt-data`` the scalar ``reward`` stays)."""
    a = config.algorithm
    if tuple(a.reward_keys) != tuple(_DEFAULT_KEYS) or config.prompt_data or config.custom_rm_path:
        return config
    if a.reward_weights is not None and tuple(a.reward_weights) != (1.0,) * len(a.reward_keys):
        return config  # weights chosen for the scalar key: validation reports the mismatch
    try:
        from relax.rollout.tasks import get_task

        task = get_task(config.task)
    except (KeyError, ValueError, ImportError):
        return config  # an unknown --task: pre-flight names it
    if SCALAR_REWARD_KEY in task.reward_keys:
        return config
    algorithm = attrs.evolve(a, reward_keys=tuple(task.reward_keys), reward_weights=None)
    return attrs.evolve(config, algorithm=algorithm)


def entry_config(config) -> RunConfig:
    """``config`` checked to be a ``RunConfig``, with the command line's derived defaults."""
    if not isinstance(config, RunConfig):
        raise _type_error(config)
    return _task_reward_keys(config)
