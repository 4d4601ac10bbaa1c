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

from relax.algorithms import numerics as N
from relax.algorithms.grpo import GRPO
from relax.algorithms.types import AdvantageInputs

_PPO_LOSS = ("eps_clip", "eps_clip_high", "eps_clip_c", "use_kl_loss", "kl_loss_coef", "kl_loss_type",
             "entropy_coef", "loss_aggregation")


class ReinforcePlusPlus(GRPO):
    name = "reinforce_plus_plus"
    paper = "Hu et al. 2025, REINFORCE++ (arXiv:2501.03262)"
    group_relative = False
    advantage_normalization = "required"
    supports_async = False  # the normalization needs the statistics of the whole batch
    hyperparameters = ("reward_keys", "reward_weights", "kl_coef", "gamma", "normalize_advantages") + _PPO_LOSS

    def normalize_rewards(self, rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        r = self.combined_rewards(rewards)
        N.check_group_ids(group_ids, r.shape[0])
        return r.to(torch.float32)

    def compute_advantages(self, inputs: AdvantageInputs, process_group=None):
        mask = inputs.response_mask
        returns = N.discounted_returns(
            N.token_rewards(inputs.rewards, mask, inputs.kl, self.config.kl_coef), mask, self.config.gamma
        )
        advantages = N.token_global_normalize(returns, mask, process_group, what=f"{self.name} advantages")
        return advantages.to(torch.float32), returns.to(torch.float32)


class ReinforcePlusPlusBaseline(GRPO):
    name = "reinforce_plus_plus_baseline"
    paper = "Hu et al. 2025, REINFORCE++ (arXiv:2501.03262)"
    advantage_normalization = "required"
    requires_rewards_normalization = True
    min_group_size = 2
    forbids_reward_side_kl = True
    allows_reward_post_process_hooks = False
    supports_async = False
    hyperparameters = ("n_samples_per_prompt", "reward_keys", "reward_weights", "normalize_advantages") + _PPO_LOSS

    def normalize_rewards(self, rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        r = self.combined_rewards(rewards)
        groups = N.Groups(N.check_group_ids(group_ids, r.shape[0]))
        return N.group_standardize(r, groups, 0.0, divide_by_std=False).to(torch.float32)

    def compute_advantages(self, inputs: AdvantageInputs, process_group=None):
        returns = N.broadcast_to_tokens(inputs.rewards, inputs.response_mask)
        advantages = N.token_global_normalize(
            returns, inputs.response_mask, process_group, what=f"{self.name} advantages"
        )
        return advantages, returns
