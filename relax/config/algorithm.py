"""``AlgorithmConfig``: the hyper-parameters every RL method shares, each declaring its flag.

A field's ``metadata=flag(...)`` (``relax.config.fields``) holds its flag's help text, ``--help``
group and rule; the ``relax train`` parser is generated from it, and ``check_fields`` applies the
same rules to a configuration built in Python. A method's own hyper-parameters are fields of its own
``Config``, a subclass of this class declared on the method (``relax.algorithms``), never here.

Only per-field checks live here (types, ranges, enums). Rules that depend on which algorithm runs
(e.g. "GDPO needs two reward keys") are derived from the algorithm's capability attributes by the
configuration validation layer, so that a user's own class gets the same checks as a built-in one.
"""

from __future__ import annotations

import math

import attrs

from relax.config.fields import (
    FINITE,
    NON_NEGATIVE,
    POSITIVE,
    POSITIVE_INT,
    REWARD_KEY,
    UNIT_INTERVAL,
    OneOf,
    field_problems,
    flag,
)

# The choices of the loss fields (the numerics implement each of them).
KL_ESTIMATORS = ("k1", "k2", "k3", "low_var_kl", "k3+", "abs")
LOSS_AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm")
OFF_POLICY_CORRECTIONS = ("none", "tis", "decoupled", "seq_tis", "seq_geo_tis", "seq_mask_tis")


def check_fields(config) -> None:
    """``ValueError`` naming the first field of ``config`` (any attrs configuration) whose value
    breaks its flag's rule: what an attrs validator would do, from the rule the flag parses with."""
    for field, value, problem in field_problems(config):
        raise ValueError(f"{field.name} {problem}, got {value!r}")


def _to_float_tuple(value):
    return tuple(float(v) for v in value) if value is not None else None


def _to_str_tuple(value):
    if isinstance(value, str):
        return (value,)
    return tuple(str(v) for v in value)


@attrs.frozen(kw_only=True)
class AlgorithmConfig:
    """The hyper-parameters every method shares. An algorithm instance is ``cls(config)``, where
    ``config`` is an instance of ``cls.Config``: this class or a method's subclass of it.

    ``reward_weights`` defaults to one per reward key. ``eps_clip_high`` defaults to ``eps_clip``.
    A subclass that defines its own ``__attrs_post_init__`` calls ``super().__attrs_post_init__()``.
    """

    # Each field's metadata declares its command-line flag (help, --help group, rule).
    n_samples_per_prompt: int = attrs.field(default=8, metadata=flag(
        "completions per prompt (group size)", group="batch shape", check=POSITIVE_INT))
    # reward_keys' flag defaults to None: the command line derives the keys from the task or data.
    reward_keys: tuple[str, ...] = attrs.field(default=("reward",), converter=_to_str_tuple, metadata=flag(
        "reward components, in the column order the algorithm sees (default: the built-in task's "
        "components; 'reward' with --prompt-data or --custom-rm-path)", group="rewards",
        names=("--reward-keys", "--gdpo-reward-keys"), nargs="+", check=REWARD_KEY, metavar="KEY",
        default=None))
    reward_weights: tuple[float, ...] | None = attrs.field(
        default=None, converter=_to_float_tuple, metadata=flag(
            "one weight per reward key (default: 1.0 each)", group="rewards",
            names=("--reward-weights", "--gdpo-reward-weights"), nargs="+", check=FINITE, metavar="W"),
    )
    # PPO-style clipping
    eps_clip: float = attrs.field(default=0.2, metadata=flag(
        "PPO clip range: the ratio is clipped to [1 - eps_clip, 1 + eps_clip_high]", group="algorithm",
        check=POSITIVE))
    eps_clip_high: float | None = attrs.field(default=None, metadata=flag(
        "upper clip range (default: --eps-clip)", group="algorithm", check=POSITIVE))
    eps_clip_c: float | None = attrs.field(default=None, metadata=flag(
        "dual-clip constant c > 1 for negative advantages (off when unset)", group="algorithm",
        check=FINITE))
    # returns / GAE
    gamma: float = attrs.field(default=1.0, metadata=flag(
        "discount factor (REINFORCE++ returns, GAE)", group="algorithm", check=UNIT_INTERVAL))
    lam: float = attrs.field(default=1.0, metadata=flag(
        "GAE lambda", group="algorithm", names=("--lambd", "--lam"), check=UNIT_INTERVAL))
    # KL: reward-side shaping (kl_coef) and/or a loss term (use_kl_loss, kl_loss_coef)
    kl_coef: float = attrs.field(default=0.0, metadata=flag(
        "reward-side KL shaping coefficient (needs reference log-probs)", group="algorithm",
        check=NON_NEGATIVE))
    use_kl_loss: bool = attrs.field(default=False, metadata=flag(
        "add a KL(policy || reference) term to the loss, weighted by --kl-loss-coef", group="algorithm"))
    kl_loss_coef: float = attrs.field(default=0.0, metadata=flag(
        "weight of the KL loss term (with --use-kl-loss)", group="algorithm", check=NON_NEGATIVE))
    kl_loss_type: str = attrs.field(default="k1", metadata=flag(
        "KL estimator for reward shaping and the KL loss", group="algorithm", check=OneOf(KL_ESTIMATORS)))
    entropy_coef: float = attrs.field(default=0.0, metadata=flag(
        "entropy bonus weight in the loss", group="algorithm", check=FINITE))
    # normalization switches
    normalize_advantages: bool = attrs.field(default=False, metadata=flag(
        "whiten advantages over the batch (required or forbidden by some methods)", group="algorithm"))
    grpo_std_normalization: bool = attrs.field(default=True, metadata=flag(
        "group rewards are only centred, not divided by the group std (Dr. GRPO)", group="algorithm",
        names=("--disable-grpo-std-normalization",)))
    rewards_normalization: bool = attrs.field(default=True, metadata=flag(
        "skip the algorithm's reward normalization: the raw --reward-weights-weighted sum of the components "
        "becomes each sample's scalar reward (refused where the method requires its normalization; "
        "docs/en/hooks.md)",
        group="algorithm", names=("--disable-rewards-normalization",)))
    loss_aggregation: str = attrs.field(
        default="token_mean", metadata=flag(
            "how per-token losses are reduced: token_mean = over all valid tokens of the batch (global "
            "per-token loss); seq_mean_token_mean / seq_mean_token_sum = per sequence first; "
            "seq_mean_token_sum_norm = token sum / (sequences x --rollout-max-response-len) (Dr. GRPO)",
            group="algorithm", check=OneOf(LOSS_AGGREGATIONS)),
    )
    # correction of samples drawn by an older policy (asynchronous training)
    off_policy_correction: str = attrs.field(
        default="none", metadata=flag(
            "how the loss corrects for samples drawn by an older (behaviour) policy: none, tis "
            "(truncated importance sampling: each token's loss x min(pi_old / pi_behaviour, cap)) or "
            "decoupled (decoupled PPO: x pi_old / pi_behaviour, tokens above the cap masked), seq_tis (every "
            "token x min(the sequence's product of the ratios, cap)), seq_geo_tis (every token x min(the geometric mean "
            "of its sequence's ratios, cap): length-safe) or seq_mask_tis (sequences whose geometric-mean "
            "ratio leaves [1/cap, cap] rejected, tis on the others)",
            group="asynchronous training", check=OneOf(OFF_POLICY_CORRECTIONS)),
    )
    off_policy_cap: float = attrs.field(default=2.0, metadata=flag(
        "the importance-weight cap of --off-policy-correction", group="asynchronous training",
        check=POSITIVE))
    # which distribution the trainer's log-probs are of (read by the backends; a method may read it too)
    full_vocabulary_log_probs: bool = attrs.field(default=False, metadata=flag(
        "score the policy and the reference over the whole vocabulary even when --rollout-top-p / "
        "--rollout-top-k / --rollout-min-p truncate sampling (default: the trainer replays the sampling's "
        "kept set and renormalizes, so that on-policy importance weights are 1; docs/en/algorithms.md)",
        group="sampling"))

    def __attrs_post_init__(self):
        if isinstance(self.n_samples_per_prompt, bool) or not isinstance(self.n_samples_per_prompt, int):
            raise TypeError(f"n_samples_per_prompt must be an int, got {self.n_samples_per_prompt!r}")
        if self.n_samples_per_prompt < 1:
            raise ValueError(f"n_samples_per_prompt must be >= 1, got {self.n_samples_per_prompt}")
        check_fields(self)  # every field's rule, a method's own Config's fields included
        if not self.reward_keys:
            raise ValueError("reward_keys must name at least one reward component")
        if self.reward_weights is None:
            object.__setattr__(self, "reward_weights", (1.0,) * len(self.reward_keys))
        if len(self.reward_weights) != len(self.reward_keys):
            raise ValueError(
                f"reward_weights has {len(self.reward_weights)} value(s) but reward_keys has "
                f"{len(self.reward_keys)} ({', '.join(self.reward_keys)}); give one weight per key"
            )
        if not all(math.isfinite(w) for w in self.reward_weights):
            raise ValueError(f"reward_weights must be finite, got {self.reward_weights}")
        if self.eps_clip_high is None:
            object.__setattr__(self, "eps_clip_high", self.eps_clip)
        if self.eps_clip_c is not None and self.eps_clip_c <= 1.0:
            raise ValueError(f"eps_clip_c (dual clip) must be > 1.0, got {self.eps_clip_c}")

    @property
    def kl_in_reward(self) -> bool:
        """A reward-side KL term is on (needs reference log-probs in the advantage stage)."""
        return self.kl_coef != 0.0

    @property
    def kl_in_loss(self) -> bool:
        """A KL loss term is on (needs reference log-probs in the policy loss)."""
        return self.use_kl_loss and self.kl_loss_coef != 0.0

    @property
    def uses_reference(self) -> bool:
        return self.kl_in_reward or self.kl_in_loss

    def replace(self, **changes) -> AlgorithmConfig:
        return attrs.evolve(self, **changes)
