"""The batch shape of a run: samples per rollout, optimizer mini-batch size and mini-batches per
rollout, derived from whichever of ``--global-batch-size`` / ``--num-steps-per-rollout`` is given, and
the validation rule that checks it (whole prompt groups per mini-batch, even data-parallel shards)."""

from __future__ import annotations

import attrs

from relax.algorithms.base import RLAlgorithm
from relax.config.run import RunConfig

# Default number of optimizer mini-batches per rollout for methods without on-policy constraints:
# the embedded recipe learns fastest with two mini-batch updates per rollout.
DEFAULT_STEPS_PER_ROLLOUT = 2


@attrs.frozen
class BatchShape:
    samples_per_rollout: int
    global_batch_size: int
    num_steps_per_rollout: int


def _default_steps(config: RunConfig, algorithm: type[RLAlgorithm]) -> int:
    if algorithm.requires_on_policy_updates:
        return 1
    n = config.algorithm.n_samples_per_prompt
    total = config.rollout_batch_size * n
    gbs = total // DEFAULT_STEPS_PER_ROLLOUT
    # two mini-batches only when each still holds whole groups and splits over the workers
    if total % DEFAULT_STEPS_PER_ROLLOUT == 0 and gbs % n == 0 and gbs % _data_parallel_size(config) == 0:
        return DEFAULT_STEPS_PER_ROLLOUT
    return 1


def _data_parallel_size(config: RunConfig) -> int:
    model_parallel = config.tensor_model_parallel_size * config.pipeline_model_parallel_size
    return max(1, config.actor_num_workers // model_parallel)


def _divisors_in_groups(total: int, n: int) -> list[int]:
    return [d for d in range(total, 0, -1) if total % d == 0 and d % n == 0]


def batch_shape(config: RunConfig, algorithm: type[RLAlgorithm]) -> tuple[BatchShape | None, list[str]]:
    """Derive ``global_batch_size`` and ``num_steps_per_rollout``; returns (shape or None, errors).

    ``global_batch_size = rollout_batch_size * n_samples_per_prompt / num_steps_per_rollout``. When
    neither is given, ``num_steps_per_rollout`` is 1 for methods that require on-policy updates and
    otherwise 2 if that keeps whole groups in each mini-batch, else 1.
    """
    n = config.algorithm.n_samples_per_prompt
    total = config.rollout_batch_size * n
    product = f"--rollout-batch-size {config.rollout_batch_size} x --n-samples-per-prompt {n} = {total}"
    gbs, steps = config.global_batch_size, config.num_steps_per_rollout
    choices = ", ".join(map(str, _divisors_in_groups(total, n)[:6]))
    if gbs is None and steps is None:
        steps = _default_steps(config, algorithm)
        gbs = total // steps
    elif gbs is None:
        if total % steps:
            return None, [
                f"--num-steps-per-rollout {steps} does not divide the {product} samples of a rollout into "
                "equal mini-batches; choose a divisor of that number"
            ]
        gbs = total // steps
    elif steps is None:
        if total % gbs:
            return None, [
                f"--global-batch-size {gbs} does not divide the {product} samples of a rollout into whole "
                f"mini-batches; use one of {choices} "
                f"(multiples of --n-samples-per-prompt that divide {total})"
            ]
        steps = total // gbs
    elif gbs * steps != total:
        return None, [
            f"--global-batch-size {gbs} x --num-steps-per-rollout {steps} = {gbs * steps} must equal "
            f"{product}; give only one of the two flags and the other is derived"
        ]
    return BatchShape(total, gbs, steps), []


def check_batch(config, algorithm, who, errors, warnings):
    n = config.algorithm.n_samples_per_prompt
    total = config.rollout_batch_size * n
    if algorithm.requires_on_policy_updates:
        if config.num_steps_per_rollout not in (None, 1):
            errors.append(
                f"{who} requires exactly one optimizer step per rollout (its loss assumes on-policy "
                f"samples): use --num-steps-per-rollout 1 (got {config.num_steps_per_rollout}) "
                "or leave it out"
            )
            return
        if config.global_batch_size not in (None, total):
            errors.append(
                f"{who} requires exactly one optimizer update per rollout: --global-batch-size must equal "
                "--rollout-batch-size x --n-samples-per-prompt = "
                f"{config.rollout_batch_size} x {n} = {total} "
                f"(got {config.global_batch_size}); leave it out to derive it"
            )
            return
    shape, shape_errors = batch_shape(config, algorithm)
    errors.extend(shape_errors)
    if shape is None:
        return
    gbs = shape.global_batch_size
    if gbs % n:
        errors.append(
            f"each optimizer mini-batch of {gbs} samples (--global-batch-size, or rollout samples / "
            f"--num-steps-per-rollout) must hold whole prompt groups of --n-samples-per-prompt {n}; use one "
            f"of {', '.join(map(str, _divisors_in_groups(total, n)[:6]))}"
        )
    dp = _data_parallel_size(config)
    if gbs % dp:
        errors.append(
            f"a mini-batch of {gbs} samples cannot be split evenly over {dp} data-parallel worker(s) "
            "(--actor-num-workers / model parallel size); choose a batch size divisible by it"
        )
    elif config.micro_batch_size is not None and (gbs // dp) % config.micro_batch_size:
        errors.append(
            f"--micro-batch-size {config.micro_batch_size} must divide each worker's mini-batch of "
            f"{gbs // dp} samples (--global-batch-size {gbs} / {dp} data-parallel worker(s))"
        )
