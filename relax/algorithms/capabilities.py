"""The capability attributes an ``RLAlgorithm`` subclass may declare, with their types and enums.

Every other part of relax (argument validation, the role topology, the rollout's group filter)
reads these attributes; none of it compares algorithm names.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class Capability:
    name: str
    type: type
    default: object
    doc: str
    choices: tuple | None = None
    minimum: int | None = None

    def check(self, owner: str, value) -> None:
        """Raise ``TypeError`` naming ``owner`` and this attribute when ``value`` is not allowed."""
        if self.type is bool:
            ok = isinstance(value, bool)
        elif self.type is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        else:
            ok = isinstance(value, self.type)
        if not ok:
            raise TypeError(
                f"{owner}.{self.name} must be of type {self.type.__name__}, got {value!r} "
                f"({type(value).__name__})"
            )
        if self.choices is not None and value not in self.choices:
            raise TypeError(
                f"{owner}.{self.name} must be one of {', '.join(map(repr, self.choices))}; got {value!r}"
            )
        if self.minimum is not None and value < self.minimum:
            raise TypeError(f"{owner}.{self.name} must be >= {self.minimum}, got {value!r}")


CAPABILITIES: dict[str, Capability] = {
    c.name: c
    for c in (
        Capability("needs_critic", bool, False, "value-based: a critic role trains values for GAE"),
        Capability(
            "uses_reward_components", bool, False,
            "normalizes each reward component separately: needs >= 2 reward keys",
        ),
        Capability("min_group_size", int, 1, "lower bound on --n-samples-per-prompt", minimum=1),
        Capability(
            "supports_async", bool, True,
            "learns from samples drawn by an older policy version: --fully-async with --max-staleness > 0 "
            "and --off-policy-correction are refused otherwise (the advantages stage always sees whole "
            "mini-batches, so batch statistics are not a reason to refuse)",
        ),
        Capability(
            "advantage_normalization", str, "optional",
            "what --normalize-advantages may do: optional, required, or forbidden",
            choices=("optional", "required", "forbidden"),
        ),
        Capability(
            "requires_rewards_normalization", bool, False,
            "rejects --disable-rewards-normalization (the reward stage is the method)",
        ),
        Capability(
            "allows_reward_post_process_hooks", bool, True,
            "false: --custom-reward-post-process-path would silently skip the reward stage",
        ),
        Capability("forbids_reward_side_kl", bool, False, "rejects a nonzero --kl-coef"),
        Capability(
            "requires_global_token_loss", bool, False,
            "the loss must be normalized by the global number of valid tokens (--loss-aggregation token_mean)",
        ),
        Capability(
            "requires_on_policy_updates", bool, False,
            "one optimizer step per rollout: rollout_batch_size x n_samples_per_prompt == global_batch_size",
        ),
        Capability(
            "kl_level", str, "token",
            "level of the importance ratio of GRPO's log_ratio (every GRPO-family loss): per token, or "
            "sequence = the mean log-ratio over the response's valid tokens on each token (GSPO)",
            choices=("token", "sequence"),
        ),
        Capability(
            "needs_teacher", bool, False,
            "distills a frozen teacher (--teacher-checkpoint, required): the training ranks score the "
            "sampled tokens with it and the loss reads PolicyLossInputs.teacher_log_probs",
        ),
        Capability(
            "group_relative", bool, False,
            "the reward stage compares samples within a prompt group: groups must stay whole, and a "
            "group without signal is dropped by the rollout",
        ),
    )
}

# Pairs that cannot both hold: (attribute, value, other attribute, other value, why).
CONTRADICTIONS = (
    ("requires_on_policy_updates", True, "supports_async", True,
     "an algorithm that needs one optimizer step per rollout cannot run asynchronously"),
    ("uses_reward_components", True, "min_group_size", 1,
     "per-component group normalization needs groups of at least 2 samples"),
)

# Upstream capability attributes relax does not have, and why: defining one is a TypeError with this
# reason (relax.algorithms.base), not a silently ignored setting.
REMOVED_CAPABILITIES = {
    "needs_full_log_probs": (
        "relax never splits a response's tokens over ranks (no context parallelism: backends shard by "
        "whole samples), so every loss already sees each response's log-probs whole; remove the attribute"
    ),
}

# Public, lower-case, non-callable class attributes an algorithm may set besides the capabilities.
METADATA_ATTRIBUTES = {
    "name": "the registered / command-line name (e.g. 'gdpo')",
    "hyperparameters": "AlgorithmConfig fields this method reads (shown by `relax algorithms NAME`)",
    "paper": "a reference to the method's paper",
}
