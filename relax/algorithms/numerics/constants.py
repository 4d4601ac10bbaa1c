"""Named constants of the numerics, so that tests and docs can refer to them."""

GRPO_STD_EPS = 1e-6  # GRPO/GSPO/SAPO/CISPO: (r - mean) / (std + GRPO_STD_EPS)
GDPO_EPS = 1e-4  # GDPO steps 1 and 3 (matches the NVlabs/TRL reference `std + 1e-4`)
WHITEN_VAR_EPS = 1e-8  # --normalize-advantages: (x - mean) * rsqrt(var + WHITEN_VAR_EPS)
TOKEN_GLOBAL_VAR_FLOOR = 1e-8  # REINFORCE++: (x - mean) * max(var, floor) ** -1/2
LOW_VAR_KL_CLAMP = 10.0  # low_var_kl is clamped to [-10, 10]
# The choices of --kl-loss-type, --loss-aggregation and --off-policy-correction are stated once, with
# their fields' rules; the numerics implement each of them.
from relax.config.algorithm import KL_ESTIMATORS, LOSS_AGGREGATIONS, OFF_POLICY_CORRECTIONS  # noqa: E402,F401
