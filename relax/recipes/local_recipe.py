"""The pieces of ``relax.recipes.local_loop.train_local`` that are not the loop: the recipe's
algorithm configuration, the result type, and the checks of its arguments."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import attrs

from relax.algorithms import AlgorithmConfig, RLAlgorithm, load_algorithm
from relax.rollout.tasks import Task


def recipe_config(
    reward_keys: Sequence[str],
    reward_weights: Sequence[float] | None = None,
    *,
    n_samples_per_prompt: int = 8,
    **overrides,
) -> AlgorithmConfig:
    """The ``AlgorithmConfig`` of the embedded-default recipe (PPO clip 0.2 / 0.28, token-mean loss).

    ``overrides`` are passed to ``AlgorithmConfig`` (e.g. ``eps_clip=0.1``; a method's own fields are on its ``Config``).
    """
    fields = {"eps_clip": 0.2, "eps_clip_high": 0.28, "loss_aggregation": "token_mean"}
    fields.update(overrides)
    return AlgorithmConfig(
        n_samples_per_prompt=n_samples_per_prompt,
        reward_keys=tuple(reward_keys),
        reward_weights=None if reward_weights is None else tuple(reward_weights),
        **fields,
    )


@attrs.frozen(kw_only=True)
class LocalRunResult:
    """What ``train_local`` returns.

    ``history`` has one dict per step (``step``, ``reward/<key>/mean`` for every task component,
    ``response/tokens_mean`` (sampled tokens per completion, ``<eos>`` included), ``kept_frac``, ``train/*`` averaged over the step's mini-batches, the diagnostics when enabled,
    ``time/step_s`` and ``time/rollout_s``). ``greedy_accuracy`` is the fraction of the 100 addition
    problems answered correctly at temperature 0 after the last step (``None`` when not evaluated).
    """

    history: list[dict[str, float]]
    greedy_accuracy: float | None
    seconds: float
    reward_keys: tuple[str, ...]
    reward_weights: tuple[float, ...]
    task_components: tuple[str, ...]


def resolve_algorithm(algorithm: str | RLAlgorithm, config: AlgorithmConfig | None) -> RLAlgorithm:
    if isinstance(algorithm, RLAlgorithm):
        if config is not None and config != algorithm.config:
            raise ValueError(
                "pass either an RLAlgorithm instance or a spec with its AlgorithmConfig, not an "
                "instance together with a different config"
            )
        return algorithm
    if config is None:
        raise ValueError(
            f"algorithm {algorithm!r} is a spec: pass its AlgorithmConfig as well (see recipe_config)"
        )
    return load_algorithm(algorithm)(config)


def check_shapes(
    algorithm: RLAlgorithm,
    task: Task,
    n_samples: int,
    prompts_per_step: int,
    num_minibatches: int,
    steps: int,
) -> None:
    config = algorithm.config
    missing = [k for k in config.reward_keys if k not in task.reward_keys]
    if missing:
        raise ValueError(
            f"reward_keys {missing} are not components of task {task.name!r} "
            f"(it has {', '.join(task.reward_keys)})"
        )
    if config.n_samples_per_prompt != n_samples:
        raise ValueError(
            f"AlgorithmConfig.n_samples_per_prompt={config.n_samples_per_prompt} but n_samples="
            f"{n_samples}; set both to the group size"
        )
    for name, value in (
        ("steps", steps),
        ("prompts_per_step", prompts_per_step),
        ("n_samples", n_samples),
        ("num_minibatches", num_minibatches),
    ):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")


def check_scales(reward_scales: Mapping[str, float] | None, task: Task) -> dict[str, float]:
    scales = dict(reward_scales or {})
    for key, factor in scales.items():
        if key not in task.reward_keys:
            raise ValueError(
                f"reward_scales names {key!r}, which is not a component of task {task.name!r} "
                f"(it has {', '.join(task.reward_keys)})"
            )
        if (
            isinstance(factor, bool)
            or not isinstance(factor, (int, float))
            or not math.isfinite(factor)
            or factor <= 0
        ):
            raise ValueError(f"reward_scales[{key!r}] must be a finite number > 0, got {factor!r}")
    return {k: float(v) for k, v in scales.items() if v != 1}
