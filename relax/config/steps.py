"""What a run's settings imply for its steps: optimizer steps per rollout and in all (what the
learning-rate schedule decays over), and how many policy versions a rollout may run ahead of training.

Plain functions of a ``RunConfig``; ``RunConfig`` also answers the last two itself
(``config.total_optimizer_steps()``, ``config.staleness_bound``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from relax.config.run import RunConfig


def num_minibatches(config: RunConfig) -> int:
    """Optimizer steps per rollout (the CLI fills ``num_steps_per_rollout``; derived otherwise)."""
    if config.num_steps_per_rollout:
        return int(config.num_steps_per_rollout)
    if config.global_batch_size:
        total = config.rollout_batch_size * config.algorithm.n_samples_per_prompt
        return max(1, total // config.global_batch_size)
    return 1


def total_optimizer_steps(config: RunConfig) -> int:
    """Optimizer steps of the whole run: ``--num-rollout`` x optimizer steps per rollout (what the
    learning-rate schedule decays over; a rollout whose groups were all dropped takes fewer)."""
    return config.num_rollout * num_minibatches(config)


def staleness_bound(config: RunConfig) -> int:
    """K: how many policy versions a rollout may run ahead of training (0: synchronous)."""
    if not config.fully_async:
        return 0
    return 1 if config.max_staleness is None else config.max_staleness
