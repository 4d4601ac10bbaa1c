"""``AlgorithmConfig``: every algorithm hyper-parameter, named after its command-line flag.

Only per-field checks live here (types, ranges, enums). Rules that depend on which algorithm runs
(e.g. "GDPO needs two reward keys") are derived from the algorithm's capability attributes by the
configuration validation layer, so that a user's own class gets the same checks as a built-in one.
"""

from __future__ import annotations

import math

import attrs

KL_ESTIMATORS = ("k1", "k2", "k3", "low_var_kl")
LOSS_AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum")
GDPO_BASELINES = ("mean", "leave_one_out")
GDPO_WHITEN_UNITS = ("sample", "token")
GDPO_WHITEN_SCOPES = ("minibatch", "rollout")
GDPO_CONSTANT_COMPONENTS = ("zero", "formula")
GDPO_PRESETS = ("nvlabs-trl", "nvlabs-verl")

# GDPO variant axes (see relax/algorithms/gdpo.py). The fields default to None = "not set": the
# value then comes from --gdpo-preset if one is given, else from GDPO_AXIS_DEFAULTS (this project's
# recommended semantics). None is what lets a preset tell an axis the user set from one left alone.
_GDPO_GROUP = "GDPO variants (see `relax algorithms gdpo`)"
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


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _gdpo_flag(help: str, **flag) -> dict:
    """attrs metadata from which the command line builds the flag (group, help, choices, type)."""
    return {"group": _GDPO_GROUP, "help": help, **flag}


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

    n_samples_per_prompt: int = attrs.field(default=8)
    reward_keys: tuple[str, ...] = attrs.field(default=("reward",), converter=_to_str_tuple)
    reward_weights: tuple[float, ...] | None = attrs.field(default=None, converter=_to_float_tuple)
    # PPO-style clipping
    eps_clip: float = attrs.field(default=0.2, validator=_positive)
    eps_clip_high: float | None = attrs.field(default=None, validator=_positive)
    eps_clip_c: float | None = attrs.field(default=None, validator=_finite)
    # returns / GAE
    gamma: float = attrs.field(default=1.0, validator=_unit_interval)
    lam: float = attrs.field(default=1.0, validator=_unit_interval)
    # KL: reward-side shaping (kl_coef) and/or a loss term (use_kl_loss, kl_loss_coef)
    kl_coef: float = attrs.field(default=0.0, validator=_non_negative)
    use_kl_loss: bool = False
    kl_loss_coef: float = attrs.field(default=0.0, validator=_non_negative)
    kl_loss_type: str = attrs.field(default="k1", validator=_one_of(KL_ESTIMATORS))
    entropy_coef: float = attrs.field(default=0.0, validator=_finite)
    # normalization switches
    normalize_advantages: bool = False
    grpo_std_normalization: bool = True
    rewards_normalization: bool = True
    loss_aggregation: str = attrs.field(default="token_mean", validator=_one_of(LOSS_AGGREGATIONS))
    # SAPO soft gate temperatures
    sapo_tau_pos: float = attrs.field(default=1.0, validator=_positive)
    sapo_tau_neg: float = attrs.field(default=1.05, validator=_positive)
    # M2PO second-moment trust region
    m2po_kl2_budget: float = attrs.field(default=0.01, validator=_non_negative)
    m2po_miniclip_low: float = attrs.field(default=0.3, validator=_unit_interval)
    m2po_miniclip_high: float = attrs.field(default=0.5, validator=_non_negative)
    # GDPO variant axes: None = not set (the preset's value, else GDPO_AXIS_DEFAULTS). The metadata
    # gives the command line its choices and help text.
    gdpo_baseline: str | None = attrs.field(
        default=None, validator=_optional(_one_of(GDPO_BASELINES)), metadata=_gdpo_flag(
            "GDPO per-component group baseline: mean, or leave_one_out (the mean of the other samples "
            "of the group) (default: mean)", choices=GDPO_BASELINES),
    )
    gdpo_std_eps: float | None = attrs.field(
        default=None, validator=_positive, metadata=_gdpo_flag(
            "GDPO epsilon added to the std in (x - baseline) / (std + eps), in the group step and the batch "
            "whitening (default: 1e-4)", type="positive_float", metavar="EPS"),
    )
    gdpo_whiten_unit: str | None = attrs.field(
        default=None, validator=_optional(_one_of(GDPO_WHITEN_UNITS)), metadata=_gdpo_flag(
            "GDPO batch whitening statistics: per completion (sample), or over valid response tokens so "
            "longer answers weigh more (token) (default: sample)", choices=GDPO_WHITEN_UNITS),
    )
    gdpo_whiten_scope: str | None = attrs.field(
        default=None, validator=_optional(_one_of(GDPO_WHITEN_SCOPES)), metadata=_gdpo_flag(
            "GDPO batch whitening over each optimizer mini-batch (minibatch), or one statistic over the "
            "whole rollout (rollout) (default: minibatch)", choices=GDPO_WHITEN_SCOPES),
    )
    gdpo_constant_component: str | None = attrs.field(
        default=None, validator=_optional(_one_of(GDPO_CONSTANT_COMPONENTS)), metadata=_gdpo_flag(
            "GDPO: a component exactly constant within its group gives exactly 0 (zero), or plain "
            "(r - mean) / (std + eps) with its rounding residue (formula) (default: zero)",
            choices=GDPO_CONSTANT_COMPONENTS),
    )
    gdpo_preset: str | None = attrs.field(
        default=None, validator=_optional(_one_of(GDPO_PRESETS)), metadata=_gdpo_flag(
            "reproduce a reference GDPO exactly: nvlabs-trl or nvlabs-verl (sets the --gdpo-* axes; do "
            "not set them as well)", choices=GDPO_PRESETS),
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
                raise ValueError(
                    f"{name}={mine!r} conflicts with gdpo_preset={preset!r}, which sets {name} to "
                    f"{value!r} to reproduce the reference exactly; drop {_flag(name)} or --gdpo-preset"
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
