"""Flags accepted in a combination where they do nothing: a warning each (one of the rules of
``relax.runtime.checks.validation``, so ``relax train`` and ``run(config)`` print them alike, before Ray).

- ``--max-turns`` without an environment (``--env-path``, or a built-in task that has one and whose
  prompts the run uses): every sample is one model turn;
- ``--task T`` whose task has an environment, with ``--prompt-data`` or ``--hf-checkpoint``: the run
  reads the file's prompts (or the model's), so the task's environment is not used;
- ``--ray-working-dir`` with ``--in-process``: no Ray worker to ship the directory to.
"""

from __future__ import annotations

import attrs


def _task_with_environment(config):
    from relax.rollout.tasks import get_task

    try:
        task = get_task(config.task)
    except (KeyError, ImportError, ValueError):  # an unknown task is reported by its own check
        return None
    return task if getattr(task, "make_env", None) is not None else None


def check_unused_flags(config, algorithm, who, errors, warnings):
    from relax.rollout.environments import is_multi_turn

    defaults = attrs.fields_dict(type(config))
    if config.max_turns != defaults["max_turns"].default and not is_multi_turn(config):
        warnings.append(
            f"--max-turns {config.max_turns} has no effect without an environment: every sample is one model "
            "turn; give --env-path (docs/en/multi-turn.md)"
        )
    if not config.env_path and (config.prompt_data or config.hf_checkpoint):
        task = _task_with_environment(config)
        if task is not None and config.task != defaults["task"].default:
            source = "--prompt-data" if config.prompt_data else "--hf-checkpoint"
            warnings.append(
                f"--task {config.task} brings an environment, which is not used with {source}: the run samples "
                "single-turn completions of its own prompts; pass --env-path for episodes"
            )
    if config.in_process and config.ray_working_dir:
        warnings.append(
            f"--ray-working-dir {config.ray_working_dir} has no effect with --in-process: the roles run in this "
            "process, in the current directory"
        )
