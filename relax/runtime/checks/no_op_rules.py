"""Configuration rules against runs that would train nothing, and flags that would do nothing: one of
the rules of ``relax.runtime.checks.validation`` (so ``relax train`` and ``run(config)`` treat them alike,
before Ray starts).

Errors: ``--off-policy-correction decoupled`` with ``--off-policy-cap`` at or below 1 (every
on-policy token has weight exactly 1 and tokens above the cap are masked, so every update is zero);
an empty ``--wandb-project`` with ``--use-wandb``. Warnings: ``--off-policy-cap`` without a
correction, ``--full-vocabulary-log-probs`` when sampling truncates nothing, the prompt-data flags (``--input-key`` ...) without a data file that reads them,
``--overwrite-output-dir`` where ``--load`` continues the run of that same directory. A task for
Hugging Face models (``--task reasoning-gym:<dataset>``) without ``--hf-checkpoint`` is an error; such
a task formats its prompts with ``--prompt-suffix``, ``--apply-chat-template`` and ``--system-prompt``.
"""

from __future__ import annotations

import attrs

# The prompt-file flags (relax.rollout.data.PromptDataset): read only when a data file is given.
_DATA_FLAGS = ("input_key", "label_key", "metadata_key", "apply_chat_template", "system_prompt",
               "prompt_suffix", "max_prompt_len")
# ... of which a task for HF models reads these (relax.rollout.tasks.reasoning_gym.PromptFormat)
_TASK_FORMAT_FLAGS = ("apply_chat_template", "system_prompt", "prompt_suffix")


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
    if a.off_policy_correction == "seq_mask_tis" and a.off_policy_cap <= 1:
        errors.append(
            f"--off-policy-correction seq_mask_tis keeps the sequences whose geometric-mean weight lies in "
            f"[1/cap, cap]; --off-policy-cap {a.off_policy_cap} makes that band empty (or a single point), so "
            "every sequence would be rejected. Pass --off-policy-cap above 1 (e.g. 2, the default)"
        )
    default_cap = attrs.fields(type(a)).off_policy_cap.default
    reads_cap = not algorithm.hyperparameters or "off_policy_cap" in algorithm.hyperparameters
    if a.off_policy_correction == "none" and a.off_policy_cap != default_cap and reads_cap:
        warnings.append(
            f"--off-policy-cap {a.off_policy_cap} has no effect without --off-policy-correction "
            "(tis, decoupled, seq_tis, seq_geo_tis or seq_mask_tis)"
        )
    truncates = config.rollout_top_p < 1.0 or config.rollout_top_k > 0 or config.rollout_min_p > 0.0
    if a.full_vocabulary_log_probs and not truncates:
        warnings.append(
            "--full-vocabulary-log-probs has no effect: sampling already keeps the whole vocabulary (it matters "
            "with --rollout-top-p below 1, --rollout-top-k or --rollout-min-p)"
        )


def _reads_data_flags(config) -> bool:
    return bool(config.prompt_data) or bool(config.evaluate and config.eval_prompt_data)


def _hf_task(config):
    """The ``--task`` when it is a task for HF models (reasoning-gym), else None."""
    if config.prompt_data or not config.task.startswith("reasoning-gym:"):
        return None
    from relax.rollout.tasks import get_task

    try:
        return get_task(config.task)
    except (KeyError, ImportError):  # reported by the CLI's --task check / at the first use
        return None


def _check_task_model(config, algorithm, who, errors, warnings):
    task = _hf_task(config)
    if task is not None and task.needs_hf_checkpoint and not config.hf_checkpoint:
        errors.append(
            f"--task {config.task} needs --hf-checkpoint (a Hugging Face model directory): the built-in tiny "
            "model's 17-token vocabulary cannot encode its questions"
        )


def _check_data_flags(config, algorithm, who, errors, warnings):
    if _reads_data_flags(config):
        return
    fields = attrs.fields_dict(type(config))
    read_by_task = _TASK_FORMAT_FLAGS if _hf_task(config) is not None else ()
    for name in _DATA_FLAGS:
        if getattr(config, name) != fields[name].default and name not in read_by_task:
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
    from relax.config.output_dir import output_dir_of
    from relax.runtime.files.run_dir import run_of_checkpoint

    owner = run_of_checkpoint(config.load)
    out = output_dir_of(config)
    if owner is not None and owner.resolve() == out.resolve():
        warnings.append(
            f"--overwrite-output-dir has no effect: --load {config.load} continues the run in {out} itself, "
            "which is kept (its metrics up to the checkpoint, its checkpoints); drop --load to start over"
        )


def check_no_op(config, algorithm, who, errors, warnings):
    """Every rule of this module."""
    for rule in (_check_off_policy, _check_task_model, _check_data_flags, _check_wandb, _check_overwrite):
        rule(config, algorithm, who, errors, warnings)
