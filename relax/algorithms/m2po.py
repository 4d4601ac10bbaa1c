"""M2PO: PPO clipping whose bounds come from a second-moment trust region (arXiv:2510.01161).

Only "harmful" tokens are constrained: those whose ratio moves in the direction the advantage pushes
(A > 0 and r > 1, or A < 0 and r < 1). With delta = log pi_old - log pi on those tokens, M2 = mean(delta^2)
must stay within ``m2po_kl2_budget``. If it does, nothing is clipped. Otherwise the smallest threshold
tau is found such that clamping |delta| at tau brings M2 under the budget, evaluated at the
sorted breakpoints; like the reference implementation we take the *previous* breakpoint (a
conservative choice: never looser than needed). The clip range is then
eps_low = max(1 - e^-tau, miniclip_low), eps_high = max(e^tau - 1, miniclip_high).
Statistics are per (micro-)batch. The solver is a sort plus a cumulative sum; no host loop.
"""

from __future__ import annotations

import math

import attrs
import torch

from relax.algorithms import numerics
from relax.algorithms.grpo import GRPO, LOSS_TERM_HYPERPARAMETERS
from relax.config.fields import NON_NEGATIVE, UNIT_INTERVAL, flag

M2PO_TINY = 1e-12  # tolerance of the harmful-set test and of the budget comparison
M2PO_NO_CLIP = 1e5  # threshold / eps_high when the trust region is inactive


def m2po_threshold(delta_sq: torch.Tensor, budget: float) -> tuple[float, float, float]:
    """Sorted-breakpoint solver -> ``(tau, m2_before, m2_after)`` for the harmful tokens' ``delta^2``."""
    n = delta_sq.numel()
    if n == 0:
        return M2PO_NO_CLIP, 0.0, 0.0
    d = delta_sq.to(torch.float64).sort().values
    m2 = float(d.mean())
    target = budget * n
    if m2 <= budget + M2PO_TINY or target >= float(d.sum()):
        return M2PO_NO_CLIP, m2, m2
    if target <= M2PO_TINY:
        return 0.0, m2, 0.0
    # S_k = sum_j min(d_j, d_k): the clamped second moment (times n) if we clamp at breakpoint k.
    csum = d.cumsum(0)
    clamped = csum + (n - 1 - torch.arange(n, device=d.device, dtype=torch.float64)) * d
    k = int(torch.searchsorted(clamped, torch.tensor([target], dtype=torch.float64, device=d.device)))
    if k == 0:
        return 0.0, m2, 0.0
    prev = float(d[k - 1])
    m2_after = (prev * (n - k) + float(csum[k - 1])) / n
    return math.sqrt(max(prev - M2PO_TINY, 0.0)), m2, m2_after


class M2PO(GRPO):
    name = "m2po"
    paper = "Second-Moment Trust Policy Optimization (arXiv:2510.01161)"
    group_relative = False
    # The trust region replaces eps_clip / eps_clip_high; the dual clip still applies.
    hyperparameters = (
        "reward_keys", "reward_weights", "normalize_advantages", "m2po_kl2_budget", "m2po_miniclip_low",
        "m2po_miniclip_high", "eps_clip_c",
    ) + LOSS_TERM_HYPERPARAMETERS

    @attrs.frozen(kw_only=True)
    class Config(GRPO.Config):
        """GRPO's hyper-parameters and the second-moment trust region."""

        m2po_kl2_budget: float = attrs.field(default=0.01, metadata=flag(
            "M2PO second-moment budget on harmful tokens", group="algorithm", check=NON_NEGATIVE))
        m2po_miniclip_low: float = attrs.field(default=0.3, metadata=flag(
            "M2PO floor of the lower clip range", group="algorithm", check=UNIT_INTERVAL))
        m2po_miniclip_high: float = attrs.field(default=0.5, metadata=flag(
            "M2PO floor of the upper clip range", group="algorithm", check=NON_NEGATIVE))

    def normalize_rewards(self, rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        r = self.combined_rewards(rewards)
        numerics.check_group_ids(group_ids, r.shape[0])
        return r.to(torch.float32)

    def surrogate(self, log_probs, log_ratio, advantages, mask):
        c = self.config
        with torch.no_grad():
            lr = log_ratio.detach()
            harmful = mask & (
                ((advantages > M2PO_TINY) & (lr > math.log1p(M2PO_TINY)))
                | ((advantages < -M2PO_TINY) & (lr < math.log1p(-M2PO_TINY)))
            )
            tau, m2_before, m2_after = m2po_threshold(lr[harmful] ** 2, c.m2po_kl2_budget)
        if tau >= M2PO_NO_CLIP:
            eps_low, eps_high = 1.0, M2PO_NO_CLIP
        else:
            eps_low = max(-math.expm1(-tau), c.m2po_miniclip_low)
            eps_high = min(max(math.expm1(tau), c.m2po_miniclip_high), M2PO_NO_CLIP)
        loss, flags = numerics.ppo_clip_loss(log_ratio, advantages, eps_low, eps_high, c.eps_clip_c)
        scalar = {
            "m2_before": m2_before, "m2_after": m2_after, "eps_low": eps_low, "eps_high": eps_high,
        }
        device = log_probs.device
        return loss, flags, {k: torch.tensor(v, dtype=torch.float32, device=device) for k, v in scalar.items()}
