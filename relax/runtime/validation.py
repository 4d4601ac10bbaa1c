"""Configuration rules derived from an algorithm's capability attributes: one validation for every
entry point. ``relax train`` (``relax.cli``) runs it before anything starts and prints its warnings;
``relax.runtime.train.run(config)`` runs it again, so a ``RunConfig`` built in Python is refused
exactly as the same command line would be. It lives in the runtime layer because ``run`` must not
import the CLI.

Every rule reads the class's capability attributes (``relax.algorithms.capabilities``) and the
configuration; none compares algorithm names, so a user's own ``RLAlgorithm`` subclass loaded from
``package.module:ClassName`` gets exactly the checks a built-in class with the same capabilities gets
(``tests/cli/test_validation.py`` scans this module's string literals to keep it that way).

``validate`` collects every error, so a user fixes them in one go; each message names the flag and
says how to fix it. Warnings are returned, not raised.
"""

from __future__ import annotations

import attrs
import torch

from relax.algorithms.base import RLAlgorithm
from relax.backends.registry import config_errors as backend_config_errors
from relax.config.fields import field_problems, flag_name
from relax.config.run import RunConfig
from relax.runtime.batch_shape import batch_shape, check_batch
from relax.runtime.eval_rules import check_evaluation
from relax.runtime.no_op_rules import check_no_op

FLOAT32_MAX = float(torch.finfo(torch.float32).max)
# Example component names shown in messages when the configured keys are too few to serve as one.
EXAMPLE_REWARD_KEYS = ("correctness", "format")


class ConfigError(ValueError):
    """One or more configuration errors; ``errors`` holds each message."""

    def __init__(self, errors: list[str]):
        self.errors = list(errors)
        super().__init__("\n".join(self.errors))

    def __reduce__(self):  # picklable with its list of errors intact
        return (type(self), (self.errors,))


def describe(algorithm: type[RLAlgorithm], algorithm_spec: str) -> str:
    """How messages refer to the method: its class name and the flag value that chose it."""
    return f"{algorithm.__name__} (--advantage-estimator {algorithm_spec})"


def resolve_batch_shape(config: RunConfig, algorithm: type[RLAlgorithm]) -> RunConfig:
    """``config`` with ``global_batch_size`` and ``num_steps_per_rollout`` filled in."""
    shape, errors = batch_shape(config, algorithm)
    if errors:
        raise ConfigError(errors)
    return attrs.evolve(
        config, global_batch_size=shape.global_batch_size, num_steps_per_rollout=shape.num_steps_per_rollout
    )


# -- the rules -----------------------------------------------------------------------------------


def _check_field_rules(config, algorithm, who, errors, warnings):
    """Each ``RunConfig`` field's own rule (``relax.config.fields``): what the flag's parser enforces
    on the command line, for a ``RunConfig`` built in Python (the hyper-parameters' ``Config`` checks
    its rules when it is built)."""
    for field, value, problem in field_problems(config):
        errors.append(f"argument {flag_name(field)}: {value!r} is out of range; it {problem}")


def _check_kl(config, algorithm, who, errors, warnings):
    a = config.algorithm
    if a.kl_coef != 0 and a.kl_loss_coef != 0:
        errors.append(
            f"Only one of --kl-coef ({a.kl_coef}) and --kl-loss-coef ({a.kl_loss_coef}) can be set: use "
            "--kl-coef for reward-side KL shaping, or --use-kl-loss --kl-loss-coef for a KL loss term"
        )
    if algorithm.forbids_reward_side_kl and a.kl_coef != 0:
        errors.append(
            f"{who} does not support a nonzero --kl-coef (got {a.kl_coef}): reward-side KL shaping is not "
            "part of this method. Set --kl-coef 0; for a KL penalty use --use-kl-loss --kl-loss-coef COEF"
        )
    if a.kl_loss_coef != 0 and not a.use_kl_loss:
        warnings.append(f"--kl-loss-coef {a.kl_loss_coef} has no effect without --use-kl-loss")
    if a.use_kl_loss and a.kl_loss_coef == 0:
        warnings.append("--use-kl-loss with --kl-loss-coef 0 adds nothing to the loss; set --kl-loss-coef")


def _check_normalization(config, algorithm, who, errors, warnings):
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


def _check_group_size(config, algorithm, who, errors, warnings):
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


def _example_keys(keys: tuple[str, ...]) -> str:
    distinct = tuple(dict.fromkeys(keys))
    if len(distinct) >= 2:
        return " ".join(distinct)
    return " ".join(dict.fromkeys(distinct + EXAMPLE_REWARD_KEYS))


def _check_reward_components(config, algorithm, who, errors, warnings):
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
        example = f"{_example_keys(keys)}, components your --custom-rm-path function returns in a mapping"
        if not config.custom_rm_path:  # the built-in task scores: its own components are a fix too
            try:  # lazily: the task registry pulls in the embedded model's tokenizer
                from relax.rollout.tasks import get_task

                task_keys = tuple(get_task(config.task).reward_keys)
            except Exception:  # noqa: BLE001 - an unknown --task is reported elsewhere; only a hint is lost
                task_keys = ()
            if len(task_keys) >= 2:
                example = (
                    f"{_example_keys(keys)} with a --custom-rm-path function that returns those components, "
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


def _check_filter(config, algorithm, who, errors, warnings):
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


def _check_dynamic_sampling(config, algorithm, who, errors, warnings):
    """--over-sampling-batch-size / --max-sampling-rounds (relax.runtime.rollout_worker)."""
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


def _check_loss(config, algorithm, who, errors, warnings):
    aggregation = config.algorithm.loss_aggregation
    if algorithm.requires_global_token_loss and aggregation != "token_mean":
        errors.append(
            f"{who} requires the loss to be normalized by the global number of valid response tokens: "
            f"use --loss-aggregation token_mean (got {aggregation})"
        )
    if config.overlong_filter:
        from relax.rollout.environments import is_multi_turn

        if is_multi_turn(config):  # an episode's loss mask leaves out environment turns: no length to compare
            errors.append(
                "--overlong-filter compares a single completion's length with --rollout-max-response-len; it does "
                "not apply to multi-turn episodes (--env-path, or a task with an environment): remove it"
            )


def _check_backend(config, algorithm, who, errors, warnings):
    errors.extend(backend_config_errors(config))


def _check_rollout_engine(config, algorithm, who, errors, warnings):
    """--rollout-engine: the engine fits the model, its sampling flags, and (vLLM) is installed and can
    load the checkpoint (relax.rollout.engines)."""
    from relax.rollout.engines import config_errors as engine_config_errors

    errors.extend(engine_config_errors(config))


def _check_logging(config, algorithm, who, errors, warnings):
    """The trackers' packages are there (they are an optional extra), and no logging flag is given
    where it does nothing (relax.runtime.trackers, docs/en/tracking.md)."""
    import importlib.util

    for on, package, switch in ((config.use_tensorboard, "tensorboard", "--use-tensorboard"),
                                (config.use_wandb, "wandb", "--use-wandb")):
        if on and importlib.util.find_spec(package) is None:
            errors.append(f"{switch} needs the {package} package: pip install 'relax-rl[tracking]'")
    defaults = RunConfig()
    if not config.use_wandb:
        for name in ("wandb_project", "wandb_group", "wandb_run_name"):
            if getattr(config, name) != getattr(defaults, name):
                warnings.append(f"{flag_name(attrs.fields_dict(RunConfig)[name])} has no effect without --use-wandb")
    if config.progress and config.log_interval != defaults.log_interval:
        warnings.append("--log-interval has no effect without --no-progress (the progress bar shows every step)")


def _check_async(config, algorithm, who, errors, warnings):
    if config.max_staleness is not None and not config.fully_async:
        errors.append(f"--max-staleness {config.max_staleness} needs --fully-async (add it, or drop --max-staleness)")
    if config.rollout_batch_size % config.rollout_num_workers:
        errors.append(
            f"--rollout-batch-size {config.rollout_batch_size} must be a multiple of --rollout-num-workers "
            f"{config.rollout_num_workers} (each worker samples an equal slice of the step's prompts)"
        )
    if algorithm.supports_async:
        return
    why = " (requires_on_policy_updates = True)" if algorithm.requires_on_policy_updates else ""
    for flag, used in (
        ("--fully-async", config.fully_async),
        (f"--off-policy-correction {config.algorithm.off_policy_correction}",
         config.algorithm.off_policy_correction != "none"),
    ):
        if used:
            errors.append(
                f"{who} cannot learn from samples of an older policy (supports_async = False{why}): drop {flag}"
            )


# Fields every run reads (the rollout, the reward stage or the runtime), whatever the method.
_FRAMEWORK_FIELDS = frozenset({"n_samples_per_prompt", "reward_keys", "reward_weights", "rewards_normalization"})


def _check_method_config(config, algorithm, who, errors, warnings):
    """``config.algorithm`` is the method's ``Config`` (or a parent's, whose values it keeps)."""
    try:
        algorithm.config_of(config.algorithm)
    except TypeError as exc:
        errors.append(f"{who}: {exc}; build the hyper-parameters with {algorithm.__name__}.Config(...)")


def _check_unused_hyperparameters(config, algorithm, who, errors, warnings):
    """A hyper-parameter set away from its default that the method never reads would silently do
    nothing (e.g. a preset of one method given to another): say so. Classes that declare no
    ``hyperparameters`` are not checked (we cannot know what they read)."""
    if not algorithm.hyperparameters:
        return
    defaults = type(config.algorithm)()
    read = set(algorithm.hyperparameters) | _FRAMEWORK_FIELDS
    for field in attrs.fields(type(config.algorithm)):
        if field.name in read or field.name == "eps_clip_high":  # eps_clip_high defaults to eps_clip
            continue
        if getattr(config.algorithm, field.name) != getattr(defaults, field.name):
            warnings.append(
                f"{who} does not read {flag_name(field)} (set to {getattr(config.algorithm, field.name)!r}); "
                "it has no effect. `relax algorithms NAME` lists the flags a method reads."
            )


# 0 .. 2**32 - 1: what every seeded generator accepts (torch, numpy, Python); each training rank adds
# its rank to it. A larger value used to fail inside a worker ("Overflow when unpacking long long").
SEED_MAX = 2**32 - 1


def _check_seed(config, algorithm, who, errors, warnings):
    if not 0 <= config.seed <= SEED_MAX:
        errors.append(f"argument --seed: {config.seed} is out of range; use an integer from 0 to {SEED_MAX}")


RULES = (
    _check_field_rules,
    _check_seed,
    _check_kl,
    _check_normalization,
    _check_group_size,
    _check_reward_components,
    _check_filter,
    _check_dynamic_sampling,
    _check_loss,
    check_batch,
    _check_backend,
    _check_async,
    _check_logging,
    _check_rollout_engine,
    check_evaluation,  # --eval-* (relax.runtime.eval_rules)
    check_no_op,  # runs that would train nothing, flags that would do nothing (relax.runtime.no_op_rules)
    _check_method_config,
    _check_unused_hyperparameters,
)


def validate(config: RunConfig, algorithm: type[RLAlgorithm]) -> list[str]:
    """Check ``config`` against ``algorithm``'s capabilities; return warnings, raise ``ConfigError``."""
    who = describe(algorithm, config.advantage_estimator)
    errors: list[str] = []
    warnings: list[str] = []
    for rule in RULES:
        rule(config, algorithm, who, errors, warnings)
    if errors:
        raise ConfigError(errors)
    return warnings
