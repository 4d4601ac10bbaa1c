"""Turn parsed ``relax train`` arguments into a ``RunConfig`` and the algorithm class.

This is where defaults that depend on other settings are filled in (reward keys from the built-in
task, run name, output directory) and where the user's hooks are imported, so that a typo in a
``module:function`` path fails here, before any process starts. The capability rules live in
``validation.py``.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import attrs

from relax.algorithms import load_algorithm
from relax.algorithms.base import RLAlgorithm
from relax.cli.arguments import method_fields
from relax.config.algorithm import AlgorithmConfig
from relax.config.fields import flag_default, flag_name
from relax.config.output_dir import default_run_name, output_dir_of
from relax.config.run import RunConfig
from relax.rollout.rewards import SCALAR_REWARD_KEY, load_function, load_reward_function
from relax.runtime.checks.validation import ConfigError, describe

RUN_FIELDS = {name: f for name, f in attrs.fields_dict(RunConfig).items() if name != "algorithm"}


def default_reward_keys(task_name: str) -> tuple[str, ...]:
    """The reward components of built-in task ``task_name`` (its ``reward_keys``).

    Imported lazily: the task registry pulls in the embedded model's tokenizer.
    """
    try:
        from relax.rollout.tasks import get_task
    except ImportError as exc:
        raise ConfigError(
            [f"the built-in tasks cannot be imported ({exc}); pass --prompt-data and --custom-rm-path"]
        )
    try:
        task = get_task(task_name)
    except (KeyError, ValueError) as exc:
        message = exc.args[0] if exc.args else str(exc)
        raise ConfigError([f"--task {task_name}: {message}"]) from None
    return tuple(task.reward_keys)


def _algorithm_config(ns: argparse.Namespace, algorithm: type[RLAlgorithm]) -> AlgorithmConfig:
    """``algorithm.Config`` of ``ns``; a rejected value raises ConfigError naming its flag."""
    fields = attrs.fields_dict(algorithm.Config)
    values = {name: getattr(ns, name) for name in fields if hasattr(ns, name)}
    try:
        return algorithm.Config(**values)
    except (TypeError, ValueError) as exc:
        message = str(exc)
        # name the flag of the field the message is about (messages start with, or mention, the field)
        mentioned = [f for f in fields if re.search(rf"\b{f}\b", message)]
        flag = flag_name(fields[max(mentioned, key=len)]) if mentioned else "configuration"
        raise ConfigError([f"argument {flag}: {message}"]) from None


def foreign_flag_warnings(ns: argparse.Namespace, algorithm: type[RLAlgorithm]) -> list[str]:
    """A flag of another method's ``Config`` (the parser accepts them all) set away from its default:
    the chosen method never reads it, so say so (as validation does for its own unread fields)."""
    own = attrs.fields_dict(algorithm.Config)
    who = describe(algorithm, ns.advantage_estimator)
    warnings = []
    for field in method_fields(algorithm):
        if field.name not in own and getattr(ns, field.name, None) != flag_default(field):
            warnings.append(
                f"{who} does not read {flag_name(field)} (set to {getattr(ns, field.name)!r}); it has no effect. "
                "`relax algorithms NAME` lists the flags a method reads."
            )
    return warnings


def _check_paths(ns: argparse.Namespace, errors: list[str]) -> None:
    for dest in ("prompt_data", "hf_checkpoint", "ref_load", "load"):
        path = getattr(ns, dest, None)
        if path is not None and not Path(path).exists():
            errors.append(f"{flag_name(RUN_FIELDS[dest])} {path}: no such file or directory")


def _load_hooks(ns: argparse.Namespace, errors: list[str]) -> None:
    if ns.custom_rm_path:
        try:
            load_reward_function(ns.custom_rm_path)
        except ValueError as exc:
            errors.append(str(exc))
    for dest in ("custom_reward_post_process_path", "dynamic_sampling_filter_path"):
        hook_path = getattr(ns, dest)
        if hook_path:
            try:
                load_function(hook_path, flag_name(RUN_FIELDS[dest]))
            except ValueError as exc:
                errors.append(str(exc))


def build_run_config(ns: argparse.Namespace) -> tuple[RunConfig, type[RLAlgorithm]]:
    """Load the algorithm class, fill derived defaults and build the (not yet validated) RunConfig."""
    try:
        algorithm = load_algorithm(ns.advantage_estimator)
    except (KeyError, ValueError, TypeError) as exc:
        message = exc.args[0] if exc.args else str(exc)
        raise ConfigError([f"argument --advantage-estimator: {message}"]) from None

    errors: list[str] = []
    _check_paths(ns, errors)
    _load_hooks(ns, errors)
    if errors:
        raise ConfigError(errors)

    if ns.reward_keys is None:
        if ns.prompt_data or ns.custom_rm_path:
            ns.reward_keys = [SCALAR_REWARD_KEY]
        else:
            ns.reward_keys = list(default_reward_keys(ns.task))
    elif ns.prompt_data is None:
        default_reward_keys(ns.task)  # still check that --task names a built-in task

    run_values = {name: getattr(ns, name) for name in RUN_FIELDS if hasattr(ns, name)}
    run_values["run_name"] = ns.run_name or default_run_name(ns.advantage_estimator)
    config = RunConfig(algorithm=_algorithm_config(ns, algorithm), **run_values)
    if not config.output_dir:  # record where the run writes, in the config and its config.yaml
        config = attrs.evolve(config, output_dir=str(output_dir_of(config)))
    return config, algorithm
