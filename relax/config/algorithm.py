"""``AlgorithmConfig``: every algorithm hyper-parameter, each field declaring its command-line flag.

A field's ``metadata=flag(...)`` (``relax.algorithms.flags``) holds its flag's help text, ``--help``
group and value parser; the ``relax train`` parser is generated from it.

Only per-field checks live here (types, ranges, enums). Rules that depend on which algorithm runs
(e.g. "GDPO needs two reward keys") are derived from the algorithm's capability attributes by the
configuration validation layer, so that a user's own class gets the same checks as a built-in one.
"""

from __future__ import annotations

import math

import attrs

from relax.config.fields import FINITE as finite_float
from relax.config.fields import NON_NEGATIVE as non_negative_float
from relax.config.fields import POSITIVE as positive_float
from relax.config.fields import POSITIVE_INT as positive_int
from relax.config.fields import REWARD_KEY as reward_key_name
from relax.config.fields import UNIT_INTERVAL as unit_interval
from relax.config.fields import flag, flag_name

# The choices of the loss fields (the numerics implement each of them).
KL_ESTIMATORS = ("k1", "k2", "k3", "low_var_kl", "k3+")
LOSS_AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm")
OFF_POLICY_CORRECTIONS = ("none", "tis", "decoupled")

GDPO_BASELINES = ("mean", "leave_one_out")
GDPO_WHITEN_UNITS = ("sample", "token")
GDPO_WHITEN_SCOPES = ("minibatch", "rollout")
GDPO_CONSTANT_COMPONENTS = ("zero", "formula")
GDPO_PRESETS = ("nvlabs-trl", "nvlabs-verl")
GDPO_GROUP = "GDPO variants (see `relax algorithms gdpo`)"  # their --help group

# GDPO variant axes (see relax/algorithms/gdpo.py). The fields default to None = "not set": the
# value then comes from --gdpo-preset if one is given, else from GDPO_AXIS_DEFAULTS (this project's
# recommended semantics). None is what lets a preset tell an axis the user set from one left alone.
GDPO_AXIS_DEFAULTS = {
    "gdpo_baseline": "mean",
    "gdpo_std_eps": 1e-4,
    "gdpo_whiten_unit": "sample",
    "gdpo_whiten_scope": "minibatch",
    "gdpo_constant_component": "zero",
}
GDPO_PRESET_AXES = {
    "nvlabs-trl": {
        "gdpo_baseline": "mean",
        "gdpo_std_eps": 1e-4,
        "gdpo_whiten_unit": "sample",
        "gdpo_whiten_scope": "rollout",
        "gdpo_constant_component": "formula",
    },
    "nvlabs-verl": {
        "gdpo_baseline": "mean",
        "gdpo_std_eps": 1e-6,
        "gdpo_whiten_unit": "token",
        "gdpo_whiten_scope": "rollout",
        "gdpo_constant_component": "formula",
    },
}


def _finite(instance, attribute, value):
    if value is not None and not math.isfinite(value):
        raise ValueError(f"{attribute.name} must be finite, got {value!r}")


def _non_negative(instance, attribute, value):
    _finite(instance, attribute, value)
    if value is not None and value < 0:
        raise ValueError(f"{attribute.name} must be >= 0, got {value!r}")


def _positive(instance, attribute, value):
    _finite(instance, attribute, value)
    if value is not None and value <= 0:
        raise ValueError(f"{attribute.name} must be > 0, got {value!r}")


def _unit_interval(instance, attribute, value):
    _finite(instance, attribute, value)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{attribute.name} must be in [0, 1], got {value!r}")


def _one_of(choices):
    def check(instance, attribute, value):
        if value not in choices:
            raise ValueError(f"{attribute.name} must be one of {', '.join(choices)}; got {value!r}")

    return check


def _optional(check):
    def optional_check(instance, attribute, value):
        if value is not None:
            check(instance, attribute, value)

    return optional_check


def _to_float_tuple(value):
    return tuple(float(v) for v in value) if value is not None else None


def _to_str_tuple(value):
    if isinstance(value, str):
        return (value,)
    return tuple(str(v) for v in value)


@attrs.frozen(kw_only=True)
class AlgorithmConfig:
    """Algorithm hyper-parameters. An algorithm instance is ``cls(config)``.

    ``reward_weights`` defaults to one per reward key. ``eps_clip_high`` defaults to ``eps_clip``.
    """

    # Each field's metadata declares its command-line flag (help, --help group, value parser).
    n_samples_per_prompt: int = attrs.field(default=8, metadata=flag(
        "completions per prompt (group size)", group="batch shape", type=positive_int))
    # reward_keys' flag defaults to None: the command line derives the keys from the task or data.
    reward_keys: tuple[str, ...] = attrs.field(default=("reward",), converter=_to_str_tuple, metadata=flag(
        "reward components, in the column order the algorithm sees (default: the built-in task's "
        "components; 'reward' with --prompt-data or --custom-rm-path)", group="rewards",
        names=("--reward-keys", "--gdpo-reward-keys"), nargs="+", type=reward_key_name, metavar="KEY",
        default=None))
    reward_weights: tuple[float, ...] | None = attrs.field(
        default=None, converter=_to_float_tuple, metadata=flag(
            "one weight per reward key (default: 1.0 each)", group="rewards",
            names=("--reward-weights", "--gdpo-reward-weights"), nargs="+", type=finite_float, metavar="W"),
    )
    # PPO-style clipping
    eps_clip: float = attrs.field(default=0.2, validator=_positive, metadata=flag(
        "PPO clip range: the ratio is clipped to [1 - eps_clip, 1 + eps_clip_high]", group="algorithm",
        type=positive_float))
    eps_clip_high: float | None = attrs.field(default=None, validator=_positive, metadata=flag(
        "upper clip range (default: --eps-clip)", group="algorithm", type=positive_float))
    eps_clip_c: float | None = attrs.field(default=None, validator=_finite, metadata=flag(
        "dual-clip constant c > 1 for negative advantages (off when unset)", group="algorithm",
        type=finite_float))
    # returns / GAE
    gamma: float = attrs.field(default=1.0, validator=_unit_interval, metadata=flag(
        "discount factor (REINFORCE++ returns, GAE)", group="algorithm", type=unit_interval))
    lam: float = attrs.field(default=1.0, validator=_unit_interval, metadata=flag(
        "GAE lambda", group="algorithm", names=("--lambd", "--lam"), type=unit_interval))
    # KL: reward-side shaping (kl_coef) and/or a loss term (use_kl_loss, kl_loss_coef)
    kl_coef: float = attrs.field(default=0.0, validator=_non_negative, metadata=flag(
        "reward-side KL shaping coefficient (needs reference log-probs)", group="algorithm",
        type=non_negative_float))
    use_kl_loss: bool = attrs.field(default=False, metadata=flag(
        "add a KL(policy || reference) term to the loss, weighted by --kl-loss-coef", group="algorithm"))
    kl_loss_coef: float = attrs.field(default=0.0, validator=_non_negative, metadata=flag(
        "weight of the KL loss term (with --use-kl-loss)", group="algorithm", type=non_negative_float))
    kl_loss_type: str = attrs.field(default="k1", validator=_one_of(KL_ESTIMATORS), metadata=flag(
        "KL estimator for reward shaping and the KL loss", group="algorithm", choices=KL_ESTIMATORS))
    entropy_coef: float = attrs.field(default=0.0, validator=_finite, metadata=flag(
        "entropy bonus weight in the loss", group="algorithm", type=finite_float))
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
        default="token_mean", validator=_one_of(LOSS_AGGREGATIONS), metadata=flag(
            "how per-token losses are reduced: token_mean = over all valid tokens of the batch (global "
            "per-token loss); seq_mean_token_mean / seq_mean_token_sum = per sequence first; "
            "seq_mean_token_sum_norm = token sum / (sequences x --rollout-max-response-len) (Dr. GRPO)",
            group="algorithm", choices=LOSS_AGGREGATIONS),
    )
    # correction of samples drawn by an older policy (asynchronous training)
    off_policy_correction: str = attrs.field(
        default="none", validator=_one_of(OFF_POLICY_CORRECTIONS), metadata=flag(
            "how the loss corrects for samples drawn by an older (behaviour) policy: none, tis "
            "(truncated importance sampling: each token's loss x min(pi_old / pi_behaviour, cap)) or "
            "decoupled (decoupled PPO: x pi_old / pi_behaviour, tokens above the cap masked)",
            group="asynchronous training", choices=OFF_POLICY_CORRECTIONS),
    )
    off_policy_cap: float = attrs.field(default=2.0, validator=_positive, metadata=flag(
        "the importance-weight cap of --off-policy-correction", group="asynchronous training",
        type=positive_float))
    # SAPO soft gate temperatures
    sapo_tau_pos: float = attrs.field(default=1.0, validator=_positive, metadata=flag(
        "SAPO gate temperature for positive advantages", group="algorithm", type=positive_float))
    sapo_tau_neg: float = attrs.field(default=1.05, validator=_positive, metadata=flag(
        "SAPO gate temperature for negative advantages", group="algorithm", type=positive_float))
    # M2PO second-moment trust region
    m2po_kl2_budget: float = attrs.field(default=0.01, validator=_non_negative, metadata=flag(
        "M2PO second-moment budget on harmful tokens", group="algorithm", type=non_negative_float))
    m2po_miniclip_low: float = attrs.field(default=0.3, validator=_unit_interval, metadata=flag(
        "M2PO floor of the lower clip range", group="algorithm", type=unit_interval))
    m2po_miniclip_high: float = attrs.field(default=0.5, validator=_non_negative, metadata=flag(
        "M2PO floor of the upper clip range", group="algorithm", type=non_negative_float))
    # GDPO variant axes: None = not set (the preset's value, else GDPO_AXIS_DEFAULTS).
    gdpo_baseline: str | None = attrs.field(
        default=None, validator=_optional(_one_of(GDPO_BASELINES)), metadata=flag(
            "GDPO per-component group baseline: mean, or leave_one_out (the mean of the other samples "
            "of the group) (default: mean)", group=GDPO_GROUP, choices=GDPO_BASELINES),
    )
    gdpo_std_eps: float | None = attrs.field(
        default=None, validator=_positive, metadata=flag(
            "GDPO epsilon added to the std in (x - baseline) / (std + eps), in the group step and the batch "
            "whitening (default: 1e-4)", group=GDPO_GROUP, type=positive_float, metavar="EPS"),
    )
    gdpo_whiten_unit: str | None = attrs.field(
        default=None, validator=_optional(_one_of(GDPO_WHITEN_UNITS)), metadata=flag(
            "GDPO batch whitening statistics: per completion (sample), or over valid response tokens so "
            "longer answers weigh more (token) (default: sample)", group=GDPO_GROUP,
            choices=GDPO_WHITEN_UNITS),
    )
    gdpo_whiten_scope: str | None = attrs.field(
        default=None, validator=_optional(_one_of(GDPO_WHITEN_SCOPES)), metadata=flag(
            "GDPO batch whitening over each optimizer mini-batch (minibatch), or one statistic over the "
            "whole rollout (rollout) (default: minibatch)", group=GDPO_GROUP, choices=GDPO_WHITEN_SCOPES),
    )
    gdpo_constant_component: str | None = attrs.field(
        default=None, validator=_optional(_one_of(GDPO_CONSTANT_COMPONENTS)), metadata=flag(
            "GDPO: a component exactly constant within its group gives exactly 0 (zero), or plain "
            "(r - mean) / (std + eps) with its rounding residue (formula) (default: zero)",
            group=GDPO_GROUP, choices=GDPO_CONSTANT_COMPONENTS),
    )
    gdpo_preset: str | None = attrs.field(
        default=None, validator=_optional(_one_of(GDPO_PRESETS)), metadata=flag(
            "reproduce a reference GDPO exactly: nvlabs-trl or nvlabs-verl (sets the --gdpo-* axes; do "
            "not set them as well)", group=GDPO_GROUP, choices=GDPO_PRESETS),
    )

    def __attrs_post_init__(self):
        if isinstance(self.n_samples_per_prompt, bool) or not isinstance(self.n_samples_per_prompt, int):
            raise TypeError(f"n_samples_per_prompt must be an int, got {self.n_samples_per_prompt!r}")
        if self.n_samples_per_prompt < 1:
            raise ValueError(f"n_samples_per_prompt must be >= 1, got {self.n_samples_per_prompt}")
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
        if self.gdpo_preset is not None:
            self._check_gdpo_preset()

    def _check_gdpo_preset(self) -> None:
        """A preset fixes every GDPO axis (and verl's reward layout); an axis set as well is a conflict."""
        preset = self.gdpo_preset
        for name, value in GDPO_PRESET_AXES[preset].items():
            mine = getattr(self, name)
            if mine is not None:
                axis_flag = flag_name(attrs.fields_dict(AlgorithmConfig)[name])
                raise ValueError(
                    f"{name}={mine!r} conflicts with gdpo_preset={preset!r}, which sets {name} to "
                    f"{value!r} to reproduce the reference exactly; drop {axis_flag} or --gdpo-preset"
                )
        if preset == "nvlabs-trl" and len(self.reward_keys) < 2:
            raise ValueError(
                "gdpo_preset='nvlabs-trl' reproduces the TRL reference's GDPO branch, which it only takes "
                f"with more than one reward; reward_keys has {len(self.reward_keys)} "
                f"({', '.join(self.reward_keys)}). Give --reward-keys at least two components "
                "(e.g. --reward-keys correctness format)"
            )
        if preset == "nvlabs-verl" and (len(self.reward_keys) != 2 or self.reward_weights != (1.0, 1.0)):
            raise ValueError(
                "gdpo_preset='nvlabs-verl' reproduces the verl reference, which sums exactly two rewards "
                f"without weights; got reward_keys={self.reward_keys} with reward_weights="
                f"{self.reward_weights}. Give exactly two --reward-keys and no --reward-weights (or 1 1)"
            )

    def gdpo_axis(self, name: str):
        """The effective value of a GDPO axis field: set > preset > project default."""
        value = getattr(self, name)
        if value is not None:
            return value
        if self.gdpo_preset is not None:
            return GDPO_PRESET_AXES[self.gdpo_preset][name]
        return GDPO_AXIS_DEFAULTS[name]

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

    def replace(self, **changes) -> "AlgorithmConfig":
        return attrs.evolve(self, **changes)
