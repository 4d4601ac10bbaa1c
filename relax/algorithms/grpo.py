"""GRPO and the methods that only change its policy loss: GSPO, SAPO, CISPO.

GRPO (Shao et al., 2024) turns each prompt group's rewards into ``(r - mean) / (std + 1e-6)``,
gives that value to every response token, and trains with the PPO clipped surrogate. GRPO is also
the parent of most built-in methods: a subclass overrides only the stage that differs
(``normalize_rewards``, ``compute_advantages``, or the per-token ``surrogate``).
"""

from __future__ import annotations

import attrs
import torch

from relax.algorithms import numerics
from relax.algorithms.base import RLAlgorithm
from relax.algorithms.types import AdvantageInputs, PolicyLossInputs, PolicyLossOutput
from relax.config.fields import POSITIVE, OneOf, flag

# The AlgorithmConfig fields of GRPO's policy stage, named once for the ``hyperparameters`` of every
# method that keeps that stage: the PPO clip of ``surrogate``, and the terms ``policy_loss`` adds to
# any surrogate (KL loss, entropy bonus, aggregation). A method with its own clip lists only what it
# still reads.
PPO_CLIP_HYPERPARAMETERS = ("eps_clip", "eps_clip_high", "eps_clip_c")
LOSS_TERM_HYPERPARAMETERS = (
    "use_kl_loss", "kl_loss_coef", "kl_loss_type", "entropy_coef", "loss_aggregation", "off_policy_correction",
    "off_policy_cap",
)
CISPO_RULES = ("paper", "upstream")  # --cispo-rule: MiniMax-M1's token weight, or the upstream project's


class GRPO(RLAlgorithm):
    """Group-relative policy optimization, with the Dr.GRPO switch ``grpo_std_normalization=False``."""

    name = "grpo"
    paper = "Shao et al. 2024, DeepSeekMath (arXiv:2402.03300); Dr.GRPO: Liu et al. 2025 (arXiv:2503.20783)"
    group_relative = True
    hyperparameters = (
        "n_samples_per_prompt", "reward_keys", "reward_weights", "grpo_std_normalization", "normalize_advantages",
    ) + PPO_CLIP_HYPERPARAMETERS + LOSS_TERM_HYPERPARAMETERS

    # ---- reward stage ----

    def combined_rewards(self, rewards: torch.Tensor) -> torch.Tensor:
        """``[N]``/``[N, K]`` -> float64 ``[N]``: the ``reward_weights``-weighted sum of the components."""
        c = self.config
        return numerics.weighted_sum(numerics.reward_matrix(rewards, c.reward_keys), c.reward_weights)

    def normalize_rewards(self, rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        r = self.combined_rewards(rewards)
        groups = numerics.Groups(numerics.check_group_ids(group_ids, r.shape[0]))
        out = numerics.group_standardize(
            r, groups, numerics.GRPO_STD_EPS, divide_by_std=self.config.grpo_std_normalization
        )
        return out.to(torch.float32)

    def group_has_signal(self, rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        """A group whose combined reward is exactly constant has zero advantages: no signal."""
        if not self.group_relative:
            return super().group_has_signal(rewards, group_ids)
        r = self.combined_rewards(rewards)
        return numerics.group_has_spread(r, numerics.check_group_ids(group_ids, r.shape[0]))

    # ---- advantage stage ----

    def check_normalize_advantages_flag(self) -> None:
        if self.config.normalize_advantages and self.advantage_normalization == "forbidden":
            raise ValueError(
                f"The {self.name!r} algorithm is incompatible with normalize_advantages: it already settles the "
                "scale of its advantages. Remove --normalize-advantages."
            )

    def compute_advantages(
        self, inputs: AdvantageInputs, process_group=None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Every valid token gets its sample's normalized reward; optional token-level whitening."""
        self.check_normalize_advantages_flag()
        numerics.check_finite(inputs.rewards, None, process_group, what=f"{self.name} advantages")
        returns = numerics.broadcast_to_tokens(inputs.rewards, inputs.response_mask)
        advantages = returns
        if self.config.normalize_advantages:
            advantages = numerics.masked_whiten(returns, inputs.response_mask, process_group)
        return advantages, returns

    # ---- policy stage ----

    def log_ratio(self, log_probs: torch.Tensor, old_log_probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """log(pi / pi_old) per token; with the capability ``kl_level = "sequence"`` (GSPO) each token
        gets its sequence's ratio exp(mean over the valid tokens of (logp - logp_old))."""
        if self.kl_level == "sequence":
            per_token = torch.where(mask, log_probs - old_log_probs, torch.zeros_like(log_probs))
            seq = per_token.sum(dim=1) / mask.sum(dim=1).clamp(min=1)
            return seq[:, None].expand_as(log_probs)
        return log_probs - old_log_probs

    def surrogate(self, log_probs, log_ratio, advantages, mask):
        """Per-token loss ``[N, T]``, per-token boolean flags (averaged into metrics), scalar metrics.

        The scalar metrics are this batch's own statistics; ``policy_loss`` turns them into shares."""
        c = self.config
        loss, flags = numerics.ppo_clip_loss(log_ratio, advantages, c.eps_clip, c.eps_clip_high, c.eps_clip_c)
        return loss, flags, {}

    def _correct_off_policy(self, inputs, mask, old, per_token, flags):
        """Weight the per-token loss by ``numerics.behaviour_weights`` (``--off-policy-correction``); the
        sequence modes weigh every token of a sequence by its sequence's weight."""
        c = self.config
        if inputs.rollout_log_probs is None:
            raise ValueError(
                f"--off-policy-correction {c.off_policy_correction} needs PolicyLossInputs.rollout_log_probs (the "
                "rollout's sampling log-probs), which is None"
            )
        behaviour = inputs.rollout_log_probs.masked_fill(~mask, 0.0)
        weight, capped = numerics.behaviour_weights(old.detach(), behaviour, c.off_policy_correction, c.off_policy_cap,
                                                    mask=mask)
        weight = weight.masked_fill(~mask, 0.0)
        return per_token * weight, {**flags, "off_policy_capped_frac": capped & mask}, {"off_policy_weight": weight}

    def policy_loss(self, inputs: PolicyLossInputs) -> PolicyLossOutput:
        c = self.config
        mask = inputs.response_mask.to(torch.bool)
        logp, old, adv, ref, entropy = numerics.masked_inputs(
            mask, inputs.log_probs, inputs.old_log_probs, inputs.advantages, inputs.ref_log_probs, inputs.entropy
        )

        def agg(x):
            return numerics.aggregate(x, mask, c.loss_aggregation, global_num_tokens=inputs.global_num_tokens,
                                      global_num_sequences=inputs.global_num_sequences,
                                      max_response_length=inputs.max_response_length)

        log_ratio = self.log_ratio(logp, old.detach(), mask)
        per_token, flags, scalars = self.surrogate(logp, log_ratio, adv.detach(), mask)
        off_policy = {}
        if c.off_policy_correction != "none":
            per_token, flags, off_policy = self._correct_off_policy(inputs, mask, old, per_token, flags)
        pg_loss = agg(per_token)
        loss = pg_loss
        metrics = {"pg_loss": pg_loss.detach(), "ppo_kl": agg(-log_ratio).detach()}
        metrics.update({k: agg(v.to(per_token.dtype)).detach() for k, v in flags.items()})
        metrics.update({k: agg(v).detach() for k, v in off_policy.items()})
        if inputs.rollout_log_probs is not None:  # behaviour vs trainer: how far off-policy the samples are
            behaviour = inputs.rollout_log_probs.masked_fill(~mask, 0.0)
            mismatch = numerics.mismatch_metrics(old.detach(), behaviour, mask)
            metrics.update({f"off_policy_{k}": agg(v).detach() for k, v in mismatch.items()})
        if scalars:
            # Per-batch statistics are not shares by themselves: weight them by this micro-batch's
            # share of the global valid tokens so that summing over micro-batches and ranks gives
            # their token-weighted mean (PolicyLossOutput's contract).
            if inputs.global_num_tokens is None:
                metrics.update(scalars)
            else:
                share = mask.sum().to(torch.float64) / inputs.global_num_tokens
                metrics.update({k: (v.to(torch.float64) * share).to(v.dtype) for k, v in scalars.items()})
        if c.entropy_coef != 0.0 and entropy is None:
            raise ValueError(
                f"entropy_coef={c.entropy_coef} needs per-token entropy, but PolicyLossInputs.entropy is None; "
                "have the backend compute it or set --entropy-coef 0"
            )
        if entropy is not None:
            mean_entropy = agg(entropy)
            metrics["entropy"] = mean_entropy.detach()
            if c.entropy_coef != 0.0:
                loss = loss - c.entropy_coef * mean_entropy
        if c.kl_in_loss and ref is None:
            raise ValueError(
                f"use_kl_loss with kl_loss_coef={c.kl_loss_coef} needs PolicyLossInputs.ref_log_probs, which is "
                "None; run the reference model (--ref-load) or remove --use-kl-loss"
            )
        if c.use_kl_loss and ref is not None:  # with kl_loss_coef 0 the term is only reported
            kl_loss = agg(numerics.kl_estimate(logp, ref.detach(), c.kl_loss_type))
            metrics["kl_loss"] = kl_loss.detach()
            loss = loss + c.kl_loss_coef * kl_loss
        return PolicyLossOutput(loss=loss, metrics=metrics)


class GSPO(GRPO):
    """GSPO: the importance ratio is per sequence, exp(mean_t (logp - logp_old)), clipped like PPO
    (``kl_level = "sequence"``: GRPO's ``log_ratio`` does the rest)."""

    name = "gspo"
    paper = "Zheng et al. 2025, Group Sequence Policy Optimization (arXiv:2507.18071)"
    kl_level = "sequence"


class SAPO(GRPO):
    """SAPO: a smooth sigmoid gate (4/tau) * sigmoid(tau (r - 1)) replaces the hard clip."""

    name = "sapo"
    paper = "Soft Adaptive Policy Optimization (Qwen team, 2025, arXiv:2511.20347)"
    hyperparameters = GRPO.hyperparameters + ("sapo_tau_pos", "sapo_tau_neg")

    @attrs.frozen(kw_only=True)
    class Config(GRPO.Config):
        """GRPO's hyper-parameters and the gate temperatures."""

        sapo_tau_pos: float = attrs.field(default=1.0, metadata=flag(
            "SAPO gate temperature for positive advantages", group="algorithm", check=POSITIVE))
        sapo_tau_neg: float = attrs.field(default=1.05, metadata=flag(
            "SAPO gate temperature for negative advantages", group="algorithm", check=POSITIVE))

    def surrogate(self, log_probs, log_ratio, advantages, mask):
        ratio = torch.exp(log_ratio)
        tau = torch.where(advantages > 0, self.config.sapo_tau_pos, self.config.sapo_tau_neg)
        gate = torch.sigmoid(tau * (ratio - 1.0))
        loss = -(4.0 / tau) * gate * advantages
        # The gate's slope 4 s (1 - s) is 1 on-policy; below 0.9 the token is effectively "clipped".
        return loss, {"pg_clipfrac": 4.0 * gate * (1.0 - gate) < 0.9}, {}


class CISPO(GRPO):
    """CISPO (MiniMax-M1, arXiv:2506.13585, eq. 4-5): REINFORCE weighted by the stop-gradient clipped
    importance ratio ``sg(clip(r, 1 - eps_clip, 1 + eps_clip_high))``, whatever the advantage's sign.

    ``eps_clip`` is the paper's eps_low (the paper sets it large, so that in effect only the upper
    bound acts) and ``eps_clip_high`` its eps_high (default: ``eps_clip``). Unlike PPO's clip, a
    clipped token keeps its gradient: only its weight is bounded. ``cispo_rule="upstream"`` keeps the
    rule of the upstream project, to reproduce its numbers."""

    name = "cispo"
    paper = "MiniMax-M1 (arXiv:2506.13585)"
    hyperparameters = tuple(h for h in GRPO.hyperparameters if h != "eps_clip_c")

    @attrs.frozen(kw_only=True)
    class Config(GRPO.Config):
        """GRPO's hyper-parameters and the weight rule."""

        cispo_rule: str = attrs.field(default="paper", metadata=flag(
            "CISPO's token weight: paper = clip(r, 1 - eps_clip, 1 + eps_clip_high) on every token "
            "(MiniMax-M1); upstream = the upstream project's min(r, 1 + eps_clip_high) for A >= 0 but "
            "max(r, 1 - eps_clip) for A < 0 (a negative-advantage token keeps any large ratio)",
            group="algorithm", check=OneOf(CISPO_RULES)))

    def importance_weight(self, ratio: torch.Tensor, advantages: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``ratio`` (no gradient) -> ``(weight, clipped)`` under ``cispo_rule``."""
        c = self.config
        if c.cispo_rule == "upstream":
            positive = advantages >= 0
            weight = torch.where(positive, ratio.clamp(max=1.0 + c.eps_clip_high), ratio.clamp(min=1.0 - c.eps_clip))
            clipped = (positive & (ratio > 1.0 + c.eps_clip_high)) | (~positive & (ratio < 1.0 - c.eps_clip))
            return weight, clipped
        low, high = 1.0 - c.eps_clip, 1.0 + c.eps_clip_high
        return ratio.clamp(low, high), (ratio < low) | (ratio > high)

    def surrogate(self, log_probs, log_ratio, advantages, mask):
        weight, clipped = self.importance_weight(torch.exp(log_ratio).detach(), advantages)
        return -weight * advantages * log_probs, {"pg_clipfrac": clipped}, {}
