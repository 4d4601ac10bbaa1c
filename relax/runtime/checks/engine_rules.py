"""The configuration rules of what runs the method: the training backend, the rollout engine, the
trackers and logging flags, asynchronous training and the rollout workers' share of a batch.

Each rule is ``rule(config, algorithm, who, errors, warnings)``: it appends messages to ``errors`` and
``warnings`` (``who`` is how messages name the method); ``relax.runtime.checks.validation`` runs them all.
"""

from __future__ import annotations

import attrs

from relax.backends.registry import config_errors as backend_config_errors
from relax.config.fields import flag_name
from relax.config.run import RunConfig


def check_backend(config, algorithm, who, errors, warnings):
    errors.extend(backend_config_errors(config))


def check_rollout_engine(config, algorithm, who, errors, warnings):
    """--rollout-engine: the engine fits the model, its sampling flags, and (vLLM) is installed and can
    load the checkpoint (relax.rollout.engines)."""
    from relax.rollout.engines import config_errors as engine_config_errors

    errors.extend(engine_config_errors(config))


def check_logging(config, algorithm, who, errors, warnings):
    """The trackers' packages are there (they are an optional extra), and no logging flag is given
    where it does nothing (relax.runtime.files.trackers, docs/en/tracking.md)."""
    import importlib.util

    for on, package, switch in ((config.use_tensorboard, "tensorboard", "--use-tensorboard"),
                                (config.use_wandb, "wandb", "--use-wandb")):
        if on and importlib.util.find_spec(package) is None:
            errors.append(f"{switch} needs the {package} package: pip install -e '.[tracking]'")
    defaults = RunConfig()
    if not config.use_wandb:
        for name in ("wandb_project", "wandb_group", "wandb_run_name"):
            if getattr(config, name) != getattr(defaults, name):
                warnings.append(f"{flag_name(attrs.fields_dict(RunConfig)[name])} has no effect without --use-wandb")
    if config.progress and config.log_interval != defaults.log_interval:
        warnings.append("--log-interval has no effect without --no-progress (the progress bar shows every step)")


def check_async(config, algorithm, who, errors, warnings):
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
