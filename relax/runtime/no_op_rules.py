"""Configuration rules against runs that would train nothing, and flags that would do nothing: one of
the rules of ``relax.runtime.validation`` (so ``relax train`` and ``run(config)`` treat them alike,
before Ray starts).

Errors: ``--off-policy-correction decoupled`` with ``--off-policy-cap`` at or below 1 (every
on-policy token has weight exactly 1 and tokens above the cap are masked, so every update is zero);
an empty ``--wandb-project`` with ``--use-wandb``. Warnings: ``--off-policy-cap`` without a
correction, the prompt-data flags (``--input-key`` ...) without a data file that reads them,
``--overwrite-output-dir`` where ``--load`` continues the run of that same directory.
"""

from __future__ import annotations

import attrs

# The prompt-file flags (relax.rollout.data.PromptDataset): read only when a data file is given.
_DATA_FLAGS = ("input_key", "label_key", "metadata_key", "apply_chat_template", "system_prompt",
               "prompt_suffix", "max_prompt_len")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _check_off_policy(config, algorithm, who, errors, warnings):
    a = config.algorithm
    if a.off_policy_correction == "decoupled" and a.off_policy_cap <= 1:
        errors.append(
            f"--off-policy-correction decoupled masks every token whose weight pi_old / pi_behaviour is above "
            f"--off-policy-cap ({a.off_policy_cap}); on-policy tokens have weight 1, so with a cap <= 1 every "
            "update would be zero. Pass --off-policy-cap above 1 (e.g. 2, the default)"
        )
    default_cap = attrs.fields(type(a)).off_policy_cap.default
    reads_cap = not algorithm.hyperparameters or "off_policy_cap" in algorithm.hyperparameters
    if a.off_policy_correction == "none" and a.off_policy_cap != default_cap and reads_cap:
        warnings.append(
            f"--off-policy-cap {a.off_policy_cap} has no effect without --off-policy-correction (tis or decoupled)"
        )


def _reads_data_flags(config) -> bool:
    return bool(config.prompt_data) or bool(config.evaluate and config.eval_prompt_data)


def _check_data_flags(config, algorithm, who, errors, warnings):
    if _reads_data_flags(config):
        return
    fields = attrs.fields_dict(type(config))
    for name in _DATA_FLAGS:
        if getattr(config, name) != fields[name].default:
            warnings.append(
                f"{_flag(name)} has no effect without --prompt-data (or --eval-prompt-data): the built-in "
                f"--task {config.task} makes its own prompts"
            )


def _check_wandb(config, algorithm, who, errors, warnings):
    if config.use_wandb and not str(config.wandb_project).strip():
        errors.append(
            f"--wandb-project {config.wandb_project!r} is empty: W&B would file the run under its default "
            "project instead; pass a project name, or drop --wandb-project (default: relax)"
        )


def _check_overwrite(config, algorithm, who, errors, warnings):
    if not (config.overwrite_output_dir and config.load):
        return
    from relax.config.run import output_dir_of
    from relax.runtime.run_dir import run_of_checkpoint

    owner = run_of_checkpoint(config.load)
    out = output_dir_of(config)
    if owner is not None and owner.resolve() == out.resolve():
        warnings.append(
            f"--overwrite-output-dir has no effect: --load {config.load} continues the run in {out} itself, "
            "which is kept (its metrics up to the checkpoint, its checkpoints); drop --load to start over"
        )


def check_no_op(config, algorithm, who, errors, warnings):
    """Every rule of this module."""
    for rule in (_check_off_policy, _check_data_flags, _check_wandb, _check_overwrite):
        rule(config, algorithm, who, errors, warnings)
