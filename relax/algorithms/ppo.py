"""PPO with a learned critic: the reward on the last valid token, per-token KL shaping, GAE.

Token rewards are ``-kl_coef * kl_t`` on every valid token plus the sequence reward on the row's
last *valid* token (not the last column: with right padding the last column is usually padding).
Advantages come from GAE with ``gamma`` / ``lam`` over the critic's ``values``; returns =
advantages + values are the critic's regression targets (see ``numerics.value_loss``).
"""

from __future__ import annotations

import torch

from relax.algorithms import numerics
from relax.algorithms.grpo import GRPO, LOSS_TERM_HYPERPARAMETERS, PPO_CLIP_HYPERPARAMETERS
from relax.algorithms.types import AdvantageInputs


class PPO(GRPO):
    name = "ppo"
    paper = "Schulman et al. 2017 (arXiv:1707.06347); Ouyang et al. 2022 (arXiv:2203.02155)"
    needs_critic = True
    group_relative = False
    # Not validated with stale samples: the critic's value targets would come from a newer
    # policy than the samples' (no correction for that exists here yet).
    supports_async = False
    hyperparameters = (
        "reward_keys", "reward_weights", "kl_coef", "gamma", "lam", "normalize_advantages",
    ) + PPO_CLIP_HYPERPARAMETERS + LOSS_TERM_HYPERPARAMETERS

    def normalize_rewards(self, rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        r = self.combined_rewards(rewards)
        numerics.check_group_ids(group_ids, r.shape[0])
        return r.to(torch.float32)

    def compute_advantages(self, inputs: AdvantageInputs, process_group=None):
        if inputs.values is None:
            raise ValueError(
                "PPO needs critic values: AdvantageInputs.values is None. Run the critic role (it starts "
                "automatically for algorithms with needs_critic) and pass its per-token values."
            )
        mask = inputs.response_mask
        numerics.check_finite(inputs.rewards, None, process_group, what="PPO advantages (rewards)")
        numerics.check_finite(inputs.values, mask, process_group, what="PPO advantages (critic values)")
        if self.config.kl_coef != 0.0 and inputs.kl is not None:
            numerics.check_finite(inputs.kl, mask, process_group, what="PPO advantages (reward-side KL)")
        rewards = numerics.token_rewards(inputs.rewards, mask, inputs.kl, self.config.kl_coef)
        advantages, returns = numerics.gae(rewards, inputs.values, mask, self.config.gamma, self.config.lam)
        if self.config.normalize_advantages:
            advantages = numerics.masked_whiten(advantages, mask, process_group)
        return advantages.to(torch.float32), returns.to(torch.float32)
