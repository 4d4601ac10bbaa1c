"""GDPO: group reward-decoupled normalization for several reward components (arXiv:2601.05242).

GRPO first sums the reward components and then normalizes the sum per group, so a component with a
large spread drowns the others. GDPO normalizes each component within its group first, then takes
the weighted sum, then whitens those per-sample values once more over the batch:

1. z_ik = (r_ik - b_ik) / (std_g(r_k) + eps)     per group g, per component k (b = group baseline);
2. a_i = sum_k w_k z_ik                           (steps 1-2: ``normalize_rewards``, rollout side);
3. A_i = (a_i - mean) / (std + eps)               over each optimizer mini-batch, across the
   data-parallel group, then broadcast to the response tokens (``compute_advantages``).

Frameworks that ship GDPO differ silently in each of these choices (the "Known deviations" table
of docs/en/gdpo.md lists who does what). Here each one is a flag, and the defaults are this
project's recommended semantics:

- ``--gdpo-baseline`` mean | leave_one_out (default mean). ``mean``: b = the group mean, as in the
  paper and both NVlabs references. ``leave_one_out``: b_i = mean of the *other* samples of the group
  (NeMo RL's default), computed as G/(G-1) * (r_i - mean_g); the std term is the same group std.
  With equal group sizes the factor is a constant that step 3 removes (up to eps), so it matters
  mostly when group sizes differ.
- ``--gdpo-std-eps`` (default 1e-4, the TRL reference's value): the eps of steps 1 and 3. Large
  enough that a narrow continuous component (std ~ 1e-3) is only damped by ~10%, small enough that
  rescaling a component 1000x leaves the result unchanged to ~1e-4.
- ``--gdpo-whiten-unit`` sample | token (default sample): step 3's statistics are taken per
  completion, or over valid response tokens (each sample counted once per token, so longer answers
  weigh more, as verl's ``masked_whiten`` does). Each sample still gets one value on all its tokens.
  Default ``sample``: the loss already weighs tokens; weighing the baseline by length as well would
  let long answers set the zero point.
- ``--gdpo-whiten-scope`` minibatch | rollout (default minibatch): step 3 per optimizer mini-batch
  (``segment_sizes``), or one statistic over the whole batch handed to ``compute_advantages``. Default
  ``minibatch``: every optimizer step then sees zero-mean, unit-scale advantages; whitening the merged
  rollout flipped the signs of 4 of 8 samples of a mini-batch in an upstream test.
- ``--gdpo-constant-component`` zero | formula (default zero): ``zero`` gives exactly 0 for a
  component that is exactly constant (bit-equal values) within its group; ``formula`` computes plain
  (r - mean) / (std + eps), keeping the rounding residue of the mean (float64 residues are ~1e-13
  after dividing by eps; float32 ones, as in the references, ~1e-5, or ~1e-2 with eps 1e-6). Default
  ``zero``: a constant component carries no information, so it should contribute nothing. A column
  that differs in the last bit (0.1 + 0.2 vs 0.3) is not constant under either rule. Step 3 of the
  recommended path always gives exact zeros for a segment whose values are all equal.

Statistics of the recommended path are float64 and two-pass, stds unbiased. The policy loss is
GRPO's PPO clip.

A preset reproduces a reference implementation exactly: a subclass in ``relax.algorithms.gdpo_presets``
(``--gdpo-preset NAME`` selects it; ``GDPO(config)`` builds the preset's class).
"""

from __future__ import annotations

from typing import ClassVar

import attrs
import torch

from relax.algorithms import diagnostics, numerics
from relax.algorithms.grpo import GRPO, LOSS_TERM_HYPERPARAMETERS, PPO_CLIP_HYPERPARAMETERS
from relax.algorithms.types import AdvantageInputs
from relax.config.fields import POSITIVE, OneOf, flag, flag_name

GDPO_GROUP = "GDPO variants (see `relax algorithms gdpo`)"  # the --help group of GDPO's own flags
BASELINES = ("mean", "leave_one_out")
WHITEN_UNITS = ("sample", "token")
WHITEN_SCOPES = ("minibatch", "rollout")
CONSTANT_COMPONENTS = ("zero", "formula")
PRESET_NAMES = ("nvlabs-trl", "nvlabs-verl")  # the PRESET of each class in gdpo_presets (checked there)

_AXES = ("gdpo_baseline", "gdpo_std_eps", "gdpo_whiten_unit", "gdpo_whiten_scope", "gdpo_constant_component")


@attrs.frozen
class GDPOVariant:
    """The effective GDPO semantics of a configuration (each axis: its flag, else the class's value)."""

    baseline: str
    std_eps: float
    whiten_unit: str
    whiten_scope: str
    constant_component: str
    preset: str | None

    @classmethod
    def from_config(cls, config, algorithm: type[GDPO] | None = None) -> GDPOVariant:
        algorithm = algorithm or GDPO.preset_class(config)

        def axis(name, value):
            return algorithm.AXES[name] if value is None else value

        return cls(
            baseline=axis("gdpo_baseline", config.gdpo_baseline),
            std_eps=axis("gdpo_std_eps", config.gdpo_std_eps),
            whiten_unit=axis("gdpo_whiten_unit", config.gdpo_whiten_unit),
            whiten_scope=axis("gdpo_whiten_scope", config.gdpo_whiten_scope),
            constant_component=axis("gdpo_constant_component", config.gdpo_constant_component),
            preset=algorithm.PRESET,
        )


class GDPO(GRPO):
    name = "gdpo"
    paper = "Group reward-Decoupled Normalization Policy Optimization (arXiv:2601.05242)"
    uses_reward_components = True
    min_group_size = 2
    advantage_normalization = "forbidden"
    requires_rewards_normalization = True
    forbids_reward_side_kl = True
    allows_reward_post_process_hooks = False
    hyperparameters = (
        ("n_samples_per_prompt", "reward_keys", "reward_weights", "gdpo_preset")
        + _AXES + PPO_CLIP_HYPERPARAMETERS + LOSS_TERM_HYPERPARAMETERS
    )

    # The value of each axis whose flag is not given: this project's recommended semantics. A preset
    # class replaces them with its reference's (and sets PRESET, the --gdpo-preset name that selects it).
    AXES: ClassVar[dict] = {
        "gdpo_baseline": "mean",
        "gdpo_std_eps": 1e-4,
        "gdpo_whiten_unit": "sample",
        "gdpo_whiten_scope": "minibatch",
        "gdpo_constant_component": "zero",
    }
    PRESET: ClassVar[str | None] = None
    PRESETS: ClassVar[dict] = {}  # --gdpo-preset name -> class, filled by relax.algorithms.gdpo_presets

    @attrs.frozen(kw_only=True)
    class Config(GRPO.Config):
        """GRPO's hyper-parameters and GDPO's variant axes. An axis defaults to None = "not set": its
        value then comes from the class (``AXES``), which is what lets a preset tell an axis the user
        set from one left alone."""

        gdpo_baseline: str | None = attrs.field(default=None, metadata=flag(
            "GDPO per-component group baseline: mean, or leave_one_out (the mean of the other samples "
            "of the group) (default: mean)", group=GDPO_GROUP, check=OneOf(BASELINES)))
        gdpo_std_eps: float | None = attrs.field(default=None, metadata=flag(
            "GDPO epsilon added to the std in (x - baseline) / (std + eps), in the group step and the batch "
            "whitening (default: 1e-4)", group=GDPO_GROUP, check=POSITIVE, metavar="EPS"))
        gdpo_whiten_unit: str | None = attrs.field(default=None, metadata=flag(
            "GDPO batch whitening statistics: per completion (sample), or over valid response tokens so "
            "longer answers weigh more (token) (default: sample)", group=GDPO_GROUP, check=OneOf(WHITEN_UNITS)))
        gdpo_whiten_scope: str | None = attrs.field(default=None, metadata=flag(
            "GDPO batch whitening over each optimizer mini-batch (minibatch), or one statistic over the "
            "whole rollout (rollout) (default: minibatch)", group=GDPO_GROUP, check=OneOf(WHITEN_SCOPES)))
        gdpo_constant_component: str | None = attrs.field(default=None, metadata=flag(
            "GDPO: a component exactly constant within its group gives exactly 0 (zero), or plain "
            "(r - mean) / (std + eps) with its rounding residue (formula) (default: zero)",
            group=GDPO_GROUP, check=OneOf(CONSTANT_COMPONENTS)))
        gdpo_preset: str | None = attrs.field(default=None, metadata=flag(
            "reproduce a reference GDPO exactly: nvlabs-trl or nvlabs-verl (sets the --gdpo-* axes; do "
            "not set them as well)", group=GDPO_GROUP, check=OneOf(PRESET_NAMES)))

        def __attrs_post_init__(self):
            super().__attrs_post_init__()
            if self.gdpo_preset is not None:
                GDPO.PRESETS[self.gdpo_preset].check_preset_config(self)

    def __new__(cls, config=None):
        # --gdpo-preset NAME is an alias of the preset's class: GDPO(config) builds that class.
        return super().__new__(cls.preset_class(config) if cls is GDPO else cls)

    @classmethod
    def preset_class(cls, config) -> type[GDPO]:
        """The class a configuration selects: its ``--gdpo-preset``'s, else GDPO itself."""
        preset = getattr(config, "gdpo_preset", None)
        return cls.PRESETS[preset] if preset is not None else cls

    def __init__(self, config=None):
        super().__init__(config)
        if self.PRESET is not None:  # also when the preset's class is named directly (module:Class)
            self.check_preset_config(self.config)
        self.variant = GDPOVariant.from_config(self.config, type(self))

    @classmethod
    def check_preset_config(cls, config) -> None:
        """A preset fixes every axis (and its reference's reward layout); an axis set as well is a conflict."""
        preset = cls.PRESET
        if config.gdpo_preset not in (None, preset):
            raise ValueError(f"gdpo_preset={config.gdpo_preset!r} contradicts the class {cls.__name__} ({preset})")
        fields = attrs.fields_dict(type(config))
        for name, value in cls.AXES.items():
            mine = getattr(config, name)
            if mine is not None:
                raise ValueError(
                    f"{name}={mine!r} conflicts with gdpo_preset={preset!r}, which sets {name} to "
                    f"{value!r} to reproduce the reference exactly; drop {flag_name(fields[name])} or --gdpo-preset"
                )
        cls.check_reward_layout(config)

    @classmethod
    def check_reward_layout(cls, config) -> None:
        """The reward keys and weights a preset's reference accepts (any, without a preset)."""

    # ---- steps 1 and 2 (rollout side) ----

    def decoupled_rewards(self, rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        """Steps 1 and 2: per-component group standardization, then the weighted sum -> ``[N]``."""
        r = numerics.reward_matrix(rewards, self.config.reward_keys)  # rejects NaN/inf, naming sample and key
        ids = numerics.check_group_ids(group_ids, r.shape[0])
        combined = self.combine_components(r, ids)
        where = numerics.first_non_finite(combined)
        if where is not None:
            raise ValueError(
                f"GDPO produced a non-finite combined advantage for sample {where[0]} "
                f"(reward_weights={self.config.reward_weights}); use smaller, finite --reward-weights"
            )
        return combined

    def combine_components(self, r: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """The recommended path of steps 1-2, in float64: the axes choose the baseline and the rule for
        a constant component."""
        v = self.variant
        groups = numerics.Groups(ids)
        if v.constant_component == "zero":
            z = numerics.group_standardize(r, groups, v.std_eps)  # a constant column gives exact zeros
        else:
            z = numerics.group_standardize_unshifted(r, groups, v.std_eps)
        if v.baseline == "leave_one_out":
            z = z * numerics.leave_one_out_factor(groups)[:, None]
        return numerics.weighted_sum(z, self.config.reward_weights)

    def normalize_rewards(self, rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        return self.decoupled_rewards(rewards, group_ids).to(torch.float32)

    def group_has_signal(self, rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        """Kept iff the combined per-sample values (what training sees) are not all equal in the group.

        A group where one component varies is kept even when the weighted sum of the *raw* rewards is
        constant; exact cancellation of the normalized components (or a zero weight) drops it.
        """
        combined = self.decoupled_rewards(rewards, group_ids).to(torch.float32)
        return numerics.group_has_spread(combined, numerics.check_group_ids(group_ids, combined.shape[0]))

    def reward_diagnostics(self, rewards, group_ids, advantages=None, *, response_mask=None):
        """The base metrics plus ``gdpo/<key>/adv_share``, at the std_eps this configuration trains with."""
        out = super().reward_diagnostics(rewards, group_ids, advantages, response_mask=response_mask)
        c = self.config
        out.update(
            diagnostics.gdpo_advantage_shares(
                rewards, group_ids, c.reward_keys, c.reward_weights, std_eps=self.variant.std_eps
            )
        )
        return out

    # ---- step 3 (advantage stage) ----

    def compute_advantages(self, inputs: AdvantageInputs, process_group=None):
        self.check_normalize_advantages_flag()
        advantages = self.whiten(inputs, process_group)
        return advantages, advantages.clone()

    def whiten(self, inputs: AdvantageInputs, process_group) -> torch.Tensor:
        """Step 3 on the recommended path: per sample or token, per mini-batch or rollout -> ``[N, T]``."""
        v = self.variant
        segments = inputs.segment_sizes if v.whiten_scope == "minibatch" else None
        what = "GDPO batch whitening"
        if v.whiten_unit == "sample":
            whitened = numerics.whiten_segments(
                inputs.rewards, segments, process_group, eps=v.std_eps, what=what
            )
        else:
            tokens = inputs.response_mask.to(torch.bool).sum(dim=1)
            whitened = numerics.whiten_segments_weighted(
                inputs.rewards, tokens, segments, process_group, eps=v.std_eps, what=what
            )
        return numerics.broadcast_to_tokens(whitened, inputs.response_mask)

    def _gathered_rewards(self, inputs: AdvantageInputs, process_group):
        """A preset's step 3 input: float32 rewards of the whole (gathered) batch, this rank's offset."""
        what = f"GDPO batch whitening (--gdpo-preset {self.PRESET})"
        rewards = inputs.rewards.to(torch.float32)
        bad = numerics.first_non_finite(rewards)
        error = None if bad is None else (
            f"{what} received a non-finite value {rewards[bad].item()!r} at sample {bad[0]} (on this rank)"
        )
        values, offset = numerics.all_gather_rows(rewards, process_group, error=error, what=what)
        return what, values, offset
