"""KL estimators from the log-probs of the sampled tokens."""

from __future__ import annotations

import torch

from relax.algorithms.numerics.constants import KL_ESTIMATORS, LOW_VAR_KL_CLAMP


def kl_estimate(log_probs: torch.Tensor, base_log_probs: torch.Tensor, kind: str = "k1") -> torch.Tensor:
    """Per-token estimate of KL(current || base) from log-probs of the sampled tokens.

    With d = log_probs - base_log_probs: k1 = d; k2 = d^2 / 2; k3 = exp(-d) - 1 + d;
    low_var_kl = k3 clamped to [-10, 10]; k3+ = k3's value with k2's gradient (d, not 1 - exp(-d)),
    straight-through: k3 is an unbiased, non-negative estimate of the KL's value, while the gradient
    of k2 is the unbiased gradient of KL(current || base) when the tokens come from the current policy;
    abs = |d| (verl's ``abs``: a non-negative, biased estimate whose gradient is sign(d)).
    """
    d = log_probs - base_log_probs
    if kind == "k1":
        return d
    if kind == "k2":
        return 0.5 * d * d
    if kind == "abs":
        return d.abs()
    if kind == "k3+":
        k2 = 0.5 * d * d
        return k2 - k2.detach() + (torch.expm1(-d) + d).detach()  # value: exactly k3 (k2 - k2 is 0)
    if kind in ("k3", "low_var_kl"):
        k3 = torch.expm1(-d) + d
        return k3.clamp(-LOW_VAR_KL_CLAMP, LOW_VAR_KL_CLAMP) if kind == "low_var_kl" else k3
    raise ValueError(f"unknown KL estimator {kind!r}; choose one of {', '.join(KL_ESTIMATORS)} (--kl-loss-type)")
