"""RLOO: REINFORCE with a leave-one-out baseline.

Each sample's baseline is the mean reward of the *other* samples of its group, so
A_i = r_i - mean_{j != i} r_j = G/(G-1) * (r_i - mean_g). The loss is plain REINFORCE,
-A * log pi, with no importance ratio; that is only unbiased on-policy, hence one optimizer step per
rollout and a loss normalized by the global number of valid tokens.
"""

from __future__ import annotations

import torch

from relax.algorithms import numerics
from relax.algorithms.grpo import GRPO, LOSS_TERM_HYPERPARAMETERS


class RLOO(GRPO):
    name = "rloo"
    paper = "Ahmadian et al. 2024, Back to Basics: Revisiting REINFORCE Style Optimization (arXiv:2402.14740)"
    requires_rewards_normalization = True
    advantage_normalization = "forbidden"
    min_group_size = 2
    forbids_reward_side_kl = True
    requires_global_token_loss = True
    requires_on_policy_updates = True
    supports_async = False
    hyperparameters = ("n_samples_per_prompt", "reward_keys", "reward_weights") + LOSS_TERM_HYPERPARAMETERS

    def normalize_rewards(self, rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        r = self.combined_rewards(rewards)
        ids = numerics.check_group_ids(group_ids, r.shape[0])
        return numerics.group_leave_one_out(r, ids).to(torch.float32)

    def surrogate(self, log_probs, log_ratio, advantages, mask):
        # No ratio and nothing to clip: pg_clipfrac is reported as 0 for dashboards shared with GRPO.
        return -advantages * log_probs, {"pg_clipfrac": torch.zeros_like(mask)}, {}
