"""The shared numerics of every built-in algorithm (pure torch; no algorithm copies any of this).

One module per job, every public name re-exported here (call sites write ``numerics.x``):

- ``checks``: input checks (shapes, finiteness) with messages that name the sample and the reward key;
- ``groups``: group statistics over arbitrary ``group_ids`` (vectorized scatter reductions, no Python
  loop over groups; ids need not be contiguous, sorted or small);
- ``collective``: the reductions over an optional ``process_group`` and the every-rank-raises rule;
- ``whiten``: batch statistics (two-pass float64 whitening per segment, REINFORCE++ token
  normalization), each reduced over the process group so shards reproduce the single-process numbers;
- ``kl``: KL estimators; ``returns``: terminal-reward placement, GAE and discounted-return scans over
  masked ``[N, T]``;
- ``losses``: loss aggregation, the clipped value loss, the PPO surrogate;
- ``off_policy``: behaviour-policy weights (token and sequence importance sampling, masking) and
  the behaviour / trainer mismatch diagnostics;
- ``constants``: the named epsilons and the lists of choices.

Conventions: statistics that can cancel are computed in float64 with two passes (mean first, then
the sum of squared deviations); results come back in float32 (or the input's floating dtype).
Masked positions never contribute: we select with ``torch.where`` rather than multiplying by the
mask, so a NaN/inf in a padded position cannot leak into a sum (``0 * nan`` is ``nan``).

Distributed rule: every rank reaches every collective. A problem found on one rank (non-finite
input, malformed ``segment_sizes``) is folded into a collective that all ranks run anyway, and then
all ranks raise together; raising before a collective would leave the other ranks waiting forever.
"""

from relax.algorithms.numerics.checks import check_group_ids, first_non_finite, reward_matrix, weighted_sum
from relax.algorithms.numerics.collective import all_gather_rows, check_finite, raise_on_all_ranks
from relax.algorithms.numerics.constants import (
    GDPO_EPS,
    GRPO_STD_EPS,
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    LOW_VAR_KL_CLAMP,
    OFF_POLICY_CORRECTIONS,
    TOKEN_GLOBAL_VAR_FLOOR,
    WHITEN_VAR_EPS,
)
from relax.algorithms.numerics.groups import (
    Groups,
    group_has_spread,
    group_leave_one_out,
    group_standardize,
    group_standardize_unshifted,
    leave_one_out_factor,
)
from relax.algorithms.numerics.kl import kl_estimate
from relax.algorithms.numerics.losses import aggregate, masked_inputs, ppo_clip_loss, value_loss
from relax.algorithms.numerics.off_policy import (
    behaviour_weights,
    mismatch_metrics,
    unit_log_weights,
    weight_statistics,
)
from relax.algorithms.numerics.returns import (
    broadcast_to_tokens,
    discounted_returns,
    gae,
    last_valid_index,
    terminal_token_rewards,
    token_rewards,
)
from relax.algorithms.numerics.whiten import (
    masked_whiten,
    token_global_normalize,
    whiten_segments,
    whiten_segments_weighted,
)

__all__ = [
    "GDPO_EPS",
    "GRPO_STD_EPS",
    "KL_ESTIMATORS",
    "LOSS_AGGREGATIONS",
    "LOW_VAR_KL_CLAMP",
    "OFF_POLICY_CORRECTIONS",
    "TOKEN_GLOBAL_VAR_FLOOR",
    "WHITEN_VAR_EPS",
    "Groups",
    "aggregate",
    "all_gather_rows",
    "behaviour_weights",
    "broadcast_to_tokens",
    "check_finite",
    "check_group_ids",
    "discounted_returns",
    "first_non_finite",
    "gae",
    "group_has_spread",
    "group_leave_one_out",
    "group_standardize",
    "group_standardize_unshifted",
    "kl_estimate",
    "last_valid_index",
    "leave_one_out_factor",
    "masked_inputs",
    "masked_whiten",
    "mismatch_metrics",
    "ppo_clip_loss",
    "raise_on_all_ranks",
    "reward_matrix",
    "terminal_token_rewards",
    "token_global_normalize",
    "token_rewards",
    "unit_log_weights",
    "value_loss",
    "weight_statistics",
    "weighted_sum",
    "whiten_segments",
    "whiten_segments_weighted",
]
