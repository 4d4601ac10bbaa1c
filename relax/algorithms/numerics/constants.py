"""Named constants of the numerics, so that tests and docs can refer to them."""

GRPO_STD_EPS = 1e-6  # GRPO/GSPO/SAPO/CISPO: (r - mean) / (std + GRPO_STD_EPS)
GDPO_EPS = 1e-4  # GDPO steps 1 and 3 (matches the NVlabs/TRL reference `std + 1e-4`)
WHITEN_VAR_EPS = 1e-8  # --normalize-advantages: (x - mean) * rsqrt(var + WHITEN_VAR_EPS)
TOKEN_GLOBAL_VAR_FLOOR = 1e-8  # REINFORCE++: (x - mean) * max(var, floor) ** -1/2
LOW_VAR_KL_CLAMP = 10.0  # low_var_kl is clamped to [-10, 10]
KL_ESTIMATORS = ("k1", "k2", "k3", "low_var_kl", "k3+")
LOSS_AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm")
OFF_POLICY_CORRECTIONS = ("none", "tis", "decoupled")
