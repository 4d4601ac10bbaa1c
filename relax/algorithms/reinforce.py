"""REINFORCE++ and REINFORCE++-baseline (Hu et al. 2025, arXiv:2501.03262).

Both normalize advantages over *all valid tokens of the whole batch* (population moments, reduced
over the data-parallel group) instead of per prompt group, and train with the PPO clipped surrogate
inherited from GRPO.

- REINFORCE++: raw reward on the last valid token, ``-kl_coef * kl`` on every token, discounted
  returns with ``gamma``, then global token normalization.
- REINFORCE++-baseline: ``r - mean`` per prompt group (no std division), broadcast to the tokens,
  then global token normalization.
"""

from __future__ import annotations

import torch

from relax.algorithms import numerics
from relax.algorithms.grpo import GRPO, LOSS_TERM_HYPERPARAMETERS, PPO_CLIP_HYPERPARAMETERS
from relax.algorithms.types import AdvantageInputs


class ReinforcePlusPlus(GRPO):
    name = "reinforce_plus_plus"
    paper = "Hu et al. 2025, REINFORCE++ (arXiv:2501.03262)"
    group_relative = False
    advantage_normalization = "required"
    hyperparameters = (
        ("reward_keys", "reward_weights", "kl_coef", "gamma", "normalize_advantages")
        + PPO_CLIP_HYPERPARAMETERS + LOSS_TERM_HYPERPARAMETERS
    )

    def normalize_rewards(self, rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        r = self.combined_rewards(rewards)
        numerics.check_group_ids(group_ids, r.shape[0])
        return r.to(torch.float32)

    def compute_advantages(self, inputs: AdvantageInputs, process_group=None):
        mask = inputs.response_mask
        c = self.config
        returns = numerics.discounted_returns(
            numerics.token_rewards(inputs.rewards, mask, inputs.kl, c.kl_coef), mask, c.gamma
        )
        advantages = numerics.token_global_normalize(
            returns, mask, process_group, what=f"{self.name} advantages"
        )
        return advantages.to(torch.float32), returns.to(torch.float32)


class ReinforcePlusPlusBaseline(GRPO):
    name = "reinforce_plus_plus_baseline"
    paper = "Hu et al. 2025, REINFORCE++ (arXiv:2501.03262)"
    advantage_normalization = "required"
    requires_rewards_normalization = True
    min_group_size = 2
    forbids_reward_side_kl = True
    allows_reward_post_process_hooks = False
    hyperparameters = (
        ("n_samples_per_prompt", "reward_keys", "reward_weights", "normalize_advantages")
        + PPO_CLIP_HYPERPARAMETERS + LOSS_TERM_HYPERPARAMETERS
    )

    def normalize_rewards(self, rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        r = self.combined_rewards(rewards)
        groups = numerics.Groups(numerics.check_group_ids(group_ids, r.shape[0]))
        return numerics.group_standardize(r, groups, 0.0, divide_by_std=False).to(torch.float32)

    def compute_advantages(self, inputs: AdvantageInputs, process_group=None):
        returns = numerics.broadcast_to_tokens(inputs.rewards, inputs.response_mask)
        advantages = numerics.token_global_normalize(
            returns, inputs.response_mask, process_group, what=f"{self.name} advantages"
        )
        return advantages, returns
