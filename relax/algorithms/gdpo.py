"""GDPO: group reward-decoupled normalization for several reward components (arXiv:2601.05242).

GRPO first sums the reward components and then normalizes the sum per group, so a component with a
large spread drowns the others. GDPO normalizes each component within its group first, then takes
the weighted sum, then whitens those per-sample values once more over each optimizer mini-batch:

1. z_ik = (r_ik - mean_g(r_k)) / (std_g(r_k) + 1e-4)    per group g, per component k (exactly 0
   when component k is constant within the group);
2. a_i = sum_k w_k z_ik                                    (``normalize_rewards``, rollout side);
3. A_i = (a_i - mean_seg) / (std_seg + 1e-4)               per mini-batch segment, over the
   data-parallel group (exactly 0 for a segment whose values are all equal), then broadcast to the
   response tokens (``compute_advantages``).

Statistics are float64 and two-pass, stds unbiased. The policy loss is GRPO's PPO clip.
"""

from __future__ import annotations

import torch

from relax.algorithms import numerics as N
from relax.algorithms.grpo import GRPO
from relax.algorithms.types import AdvantageInputs


class GDPO(GRPO):
    name = "gdpo"
    paper = "Group reward-Decoupled Normalization Policy Optimization (arXiv:2601.05242)"
    uses_reward_components = True
    min_group_size = 2
    advantage_normalization = "forbidden"
    requires_rewards_normalization = True
    forbids_reward_side_kl = True
    allows_reward_post_process_hooks = False
    supports_async = False  # step 3 needs whole mini-batches (and the data-parallel group)
    hyperparameters = ("n_samples_per_prompt", "reward_keys", "reward_weights", "eps_clip", "eps_clip_high",
                       "eps_clip_c", "use_kl_loss", "kl_loss_coef", "kl_loss_type", "entropy_coef",
                       "loss_aggregation")

    def decoupled_rewards(self, rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        """Steps 1 and 2 in float64: per-component group standardization, then the weighted sum."""
        r = N.reward_matrix(rewards, self.config.reward_keys)
        groups = N.Groups(N.check_group_ids(group_ids, r.shape[0]))
        z = N.group_standardize(r, groups, N.GDPO_EPS)  # a constant column gives exact zeros
        combined = N.weighted_sum(z, self.config.reward_weights)
        where = N.first_non_finite(combined)
        if where is not None:
            raise ValueError(
                f"GDPO produced a non-finite combined advantage for sample {where[0]} "
                f"(reward_weights={self.config.reward_weights}); use smaller, finite --reward-weights"
            )
        return combined

    def normalize_rewards(self, rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        return self.decoupled_rewards(rewards, group_ids).to(torch.float32)

    def group_has_signal(self, rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        """Kept iff the combined per-sample values (what training sees) are not all equal in the group.

        A group where one component varies is kept even when the weighted sum of the *raw* rewards is
        constant; exact cancellation of the normalized components (or a zero weight) drops it.
        """
        combined = self.decoupled_rewards(rewards, group_ids).to(torch.float32)
        return N.group_has_spread(combined, N.check_group_ids(group_ids, combined.shape[0]))

    def compute_advantages(self, inputs: AdvantageInputs, process_group=None):
        self.check_normalize_advantages_flag()
        whitened = N.whiten_segments(
            inputs.rewards, inputs.segment_sizes, process_group, eps=N.GDPO_EPS, what="GDPO batch whitening"
        )
        advantages = N.broadcast_to_tokens(whitened, inputs.response_mask)
        return advantages, advantages.clone()
