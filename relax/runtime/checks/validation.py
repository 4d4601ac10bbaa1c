"""Configuration rules derived from an algorithm's capability attributes: one validation for every
entry point. ``relax train`` (``relax.cli``) runs it before anything starts and prints its warnings;
``relax.runtime.driver.train.run(config)`` runs it again, so a ``RunConfig`` built in Python is refused
exactly as the same command line would be. It lives in the runtime layer because ``run`` must not
import the CLI.

Every rule reads the class's capability attributes (``relax.algorithms.capabilities``) and the
configuration; none compares algorithm names, so a user's own ``RLAlgorithm`` subclass loaded from
``package.module:ClassName`` gets exactly the checks a built-in class with the same capabilities gets
(``tests/cli/test_validation.py`` scans the rule modules' string literals to keep it that way).

The rules live by what they check: ``method_rules`` (hyper-parameters, seed, KL, loss),
``reward_rules`` (normalization, groups, reward components, dynamic sampling), ``engine_rules``
(backend, rollout engine, logging, asynchronous training), ``batch_shape``, ``eval_rules`` and
``no_op_rules``; this module holds ``ConfigError`` and runs them in order (``RULES``).

``validate`` collects every error, so a user fixes them in one go; each message names the flag and
says how to fix it. Warnings are returned, not raised.
"""

from __future__ import annotations

import attrs

from relax.algorithms.base import RLAlgorithm
from relax.config.run import RunConfig
from relax.runtime.checks.batch_shape import batch_shape, check_batch
from relax.runtime.checks.engine_rules import check_async, check_backend, check_logging, check_rollout_engine
from relax.runtime.checks.eval_rules import check_evaluation
from relax.runtime.checks.in_process_rules import check_in_process
from relax.runtime.checks.method_rules import (
    check_field_rules,
    check_kl,
    check_loss,
    check_method_config,
    check_seed,
    check_teacher,
    check_teacher_distribution,
    check_unused_hyperparameters,
)
from relax.runtime.checks.no_op_rules import check_no_op
from relax.runtime.checks.reward_rules import (
    check_dynamic_sampling,
    check_filter,
    check_group_size,
    check_normalization,
    check_reward_components,
    check_reward_services,
)
from relax.runtime.checks.unused_flag_rules import check_unused_flags


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


RULES = (
    check_field_rules,
    check_seed,
    check_kl,
    check_teacher,
    check_normalization,
    check_group_size,
    check_reward_components,
    check_reward_services,
    check_filter,
    check_dynamic_sampling,
    check_loss,
    check_batch,
    check_backend,
    check_async,
    check_in_process,  # --in-process: what needs Ray is refused (relax.runtime.checks.in_process_rules)
    check_logging,
    check_rollout_engine,
    check_evaluation,  # --eval-* (relax.runtime.checks.eval_rules)
    check_no_op,  # runs that would train nothing, flags that would do nothing (relax.runtime.checks.no_op_rules)
    check_unused_flags,  # --max-turns, --task, --ray-working-dir where they do nothing
    check_method_config,
    check_teacher_distribution,  # a method reading the teacher's distribution (GKD): backend, sharding
    check_unused_hyperparameters,
)


def validate(config: RunConfig, algorithm: type[RLAlgorithm]) -> list[str]:
    """Check ``config`` against ``algorithm``'s capabilities; return warnings, raise ``ConfigError``."""
    who = describe(algorithm, config.advantage_estimator)
    errors: list[str] = []
    warnings: list[str] = []
    for rule in RULES:
        rule(config, algorithm, who, errors, warnings)
        if rule is check_field_rules and errors:  # the other rules compare values: a str lr would crash them
            raise ConfigError(errors)
    if errors:
        raise ConfigError(errors)
    return warnings
