"""The configuration rules of the reward stage: advantage and reward normalization, the group size,
the reward components and their weights, the group filter and dynamic sampling.

Each rule is ``rule(config, algorithm, who, errors, warnings)``: it appends messages to ``errors`` and
``warnings`` (``who`` is how messages name the method); ``relax.runtime.checks.validation`` runs them all.
"""

from __future__ import annotations

import attrs
import torch

from relax.algorithms.base import RLAlgorithm

FLOAT32_MAX = float(torch.finfo(torch.float32).max)
# Example component names shown in messages when the configured keys are too few to serve as one.
EXAMPLE_REWARD_KEYS = ("correctness", "format")


def check_normalization(config, algorithm, who, errors, warnings):
    a = config.algorithm
    if algorithm.advantage_normalization == "required" and not a.normalize_advantages:
        errors.append(f"{who} requires advantage normalization: add --normalize-advantages")
    if algorithm.advantage_normalization == "forbidden" and a.normalize_advantages:
        errors.append(
            f"{who} is incompatible with --normalize-advantages: the method already sets the scale of its "
            "advantages, and whitening again would change it. Remove --normalize-advantages"
        )
    if algorithm.requires_rewards_normalization and not a.rewards_normalization:
        errors.append(
            f"{who} requires rewards normalization (its reward stage is the method): remove "
            "--disable-rewards-normalization"
        )
    if config.custom_reward_post_process_path and not a.rewards_normalization:
        errors.append(
            f"--custom-reward-post-process-path {config.custom_reward_post_process_path} replaces the reward "
            "stage, so --disable-rewards-normalization would do nothing: give only one of the two"
        )
    if not algorithm.allows_reward_post_process_hooks and config.custom_reward_post_process_path:
        errors.append(
            f"--custom-reward-post-process-path replaces the reward stage, which would silently skip "
            f"{who}'s reward normalization: remove --custom-reward-post-process-path "
            f"({config.custom_reward_post_process_path})"
        )


def check_group_size(config, algorithm, who, errors, warnings):
    n = config.algorithm.n_samples_per_prompt
    if n < algorithm.min_group_size:
        errors.append(
            f"{who} requires --n-samples-per-prompt >= {algorithm.min_group_size} (got {n}): its reward "
            "stage is undefined for a smaller group. Pass e.g. "
            f"--n-samples-per-prompt {max(8, algorithm.min_group_size)}"
        )
    elif algorithm.group_relative and n < 2:
        errors.append(
            f"{who} compares the samples of a prompt group, so with --n-samples-per-prompt {n} every group "
            "carries no signal and is dropped. Pass e.g. --n-samples-per-prompt 8"
        )


def example_keys(keys: tuple[str, ...]) -> str:
    distinct = tuple(dict.fromkeys(keys))
    if len(distinct) >= 2:
        return " ".join(distinct)
    return " ".join(dict.fromkeys(distinct + EXAMPLE_REWARD_KEYS))


def check_reward_components(config, algorithm, who, errors, warnings):
    a = config.algorithm
    keys, weights = tuple(a.reward_keys), a.reward_weights
    # Weight count and finiteness are enforced by AlgorithmConfig itself (and reported per flag).
    duplicates = sorted({k for k in keys if keys.count(k) > 1})
    if duplicates:
        errors.append(
            f"--reward-keys lists {', '.join(map(repr, duplicates))} more than once ({' '.join(keys)}); "
            "give each reward component once"
        )
    if config.reward_key is not None and config.reward_key not in keys:
        errors.append(
            f"--reward-key {config.reward_key} is not one of the reward keys ({' '.join(keys)}); pick one of "
            f"them, or add it to --reward-keys"
        )
    if not algorithm.uses_reward_components:
        return
    distinct = tuple(dict.fromkeys(keys))
    if len(distinct) < 2:
        example = f"{example_keys(keys)}, components your --custom-rm-path function returns in a mapping"
        if not config.custom_rm_path:  # the built-in task scores: its own components are a fix too
            try:  # lazily: the task registry pulls in the embedded model's tokenizer
                from relax.rollout.tasks import get_task

                task_keys = tuple(get_task(config.task).reward_keys)
            except Exception:  # noqa: BLE001 - an unknown --task is reported elsewhere; only a hint is lost
                task_keys = ()
            if len(task_keys) >= 2:
                example = (
                    f"{example_keys(keys)} with a --custom-rm-path function that returns those components, "
                    f"or --reward-keys {' '.join(task_keys)} (the components of --task {config.task})"
                )
        errors.append(
            f"{who} needs at least two reward keys (it normalizes each reward component separately), got "
            f"{len(distinct)} ({' '.join(distinct)}); pass e.g. --reward-keys {example}"
        )
    if all(w == 0 for w in weights):
        errors.append(
            f"--reward-weights are all zero ({' '.join(map(str, weights))}): {who} would learn nothing"
        )
        return
    as_float32 = torch.tensor(weights, dtype=torch.float64).to(torch.float32)
    if not torch.isfinite(as_float32).all():
        errors.append(
            f"--reward-weights {' '.join(map(str, weights))} overflow float32 (|w| > {FLOAT32_MAX:.4e}); "
            "rescale them"
        )
    elif (as_float32 == 0).all():
        errors.append(
            f"--reward-weights {' '.join(map(str, weights))} are all zero once cast to float32; rescale them"
        )


def check_filter(config, algorithm, who, errors, warnings):
    if config.dynamic_sampling_filter_path and algorithm.uses_reward_components:
        warnings.append(
            f"--dynamic-sampling-filter-path {config.dynamic_sampling_filter_path} with {who}: a group can "
            "carry signal in its combined, per-component normalized reward even when one component is flat; "
            "make sure your filter looks at every reward key, not only --reward-key"
        )


def _inherited_group_filter(algorithm) -> bool:
    """``group_has_signal`` is the built-in one (which keeps everything unless ``group_relative``)."""
    from relax.algorithms.grpo import GRPO

    return algorithm.group_has_signal in (RLAlgorithm.group_has_signal, GRPO.group_has_signal)


def check_dynamic_sampling(config, algorithm, who, errors, warnings):
    """--over-sampling-batch-size / --max-sampling-rounds (relax.runtime.step.rollout_worker)."""
    over, workers = config.over_sampling_batch_size, config.rollout_num_workers
    if over is not None and over % workers:
        errors.append(
            f"--over-sampling-batch-size {over} must be a multiple of --rollout-num-workers {workers} (each "
            "worker samples an equal slice of every sampling round's prompts)"
        )
    keeps_all = not algorithm.group_relative and _inherited_group_filter(algorithm)
    if config.max_sampling_rounds > 1 and keeps_all and not config.dynamic_sampling_filter_path:
        warnings.append(
            f"--max-sampling-rounds {config.max_sampling_rounds} has no effect: {who} keeps every prompt group "
            "(group_relative = False) and no --dynamic-sampling-filter-path drops any, so the first round "
            "always fills the batch"
        )
    if over is not None and config.max_sampling_rounds == 1 and over < config.rollout_batch_size:
        warnings.append(
            f"--over-sampling-batch-size {over} < --rollout-batch-size {config.rollout_batch_size} with "
            "--max-sampling-rounds 1: every step trains on at most "
            f"{over} prompt groups; raise --max-sampling-rounds to refill the batch"
        )


def check_reward_services(config, algorithm, who, errors, warnings):
    """--reward-model-path / --judge-model-path: their components are reward keys of their own."""
    keys = tuple(config.algorithm.reward_keys)
    services = []
    if config.reward_model_path:
        services.append(("--reward-model-key", config.reward_model_key))
    if config.judge_model_path:
        services.append(("--judge-key", config.judge_key))
        if not config.judge_template:
            errors.append(f"--judge-model-path {config.judge_model_path} needs --judge-template FILE (the judge's prompt "
                          "with {prompt} and {response} placeholders)")
    elif config.judge_template:
        errors.append(f"--judge-template {config.judge_template} does nothing without --judge-model-path")
    for name, key in services:
        if key not in keys:
            errors.append(f"{name} {key} is not one of --reward-keys ({' '.join(keys)}): add it, e.g. "
                          f"--reward-keys {' '.join(dict.fromkeys(keys + (key,)))}")
    if len(services) == 2 and services[0][1] == services[1][1]:
        errors.append(f"--reward-model-key and --judge-key are both {services[0][1]!r}: give each service its own "
                      "reward component")
    for prefix, path_flag, on in (("reward_model_", "--reward-model-path", config.reward_model_path),
                                  ("judge_", "--judge-model-path", config.judge_model_path)):
        if on:
            continue
        for field in attrs.fields(type(config)):
            if (field.name.startswith(prefix) and not field.name.endswith(("_path", "_template"))
                    and getattr(config, field.name) != field.default):
                warnings.append(f"--{field.name.replace('_', '-')} has no effect without {path_flag}")
    if services and config.env_path:
        errors.append(f"--env-path {config.env_path}: multi-turn episodes are scored by the environment's rewards; "
                      "the reward services (--reward-model-path, --judge-model-path) score single-turn samples only")
