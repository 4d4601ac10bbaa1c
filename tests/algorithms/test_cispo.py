"""CISPO by the paper, and the upstream rule kept as ``--cispo-rule upstream``.

MiniMax-M1 (arXiv:2506.13585, eq. 4-5) weighs every token by ``sg(clip(r, 1 - eps_low, 1 + eps_high))``
whatever the sign of the advantage. The upstream project capped only positive-advantage tokens; its
numbers are pinned below bit for bit (values computed with the rule before the change, as float hex).
"""

import math

import numpy as np
import pytest
import torch

from relax.algorithms import AlgorithmConfig, PolicyLossInputs, get_algorithm
from relax.algorithms.grpo import CISPO

UPSTREAM_PER_TOKEN = [
    '-0x1.d245f60000000p+3', '-0x1.9973f20000000p-1', '-0x1.bc32500000000p-2', '-0x1.3181bc0000000p+1',
    '-0x1.060c620000000p+4', '-0x1.a53ae00000000p+0', '-0x1.cb7e7a0000000p-3', '-0x1.3e3c8e0000000p+1',
    '-0x1.b3511c0000000p+0', '-0x1.ea8ec60000000p+1', '-0x1.da40e00000000p+3', '-0x1.82d1c60000000p+0',
    '0x1.7b5ad80000000p-3', '0x1.af65580000000p+1', '0x1.63de520000000p-1', '0x1.34ba8e0000000p-1',
    '0x1.04b39c0000000p-1', '0x1.51121a0000000p+0', '-0x1.5ae6c60000000p+0', '-0x1.bff2960000000p+2',
    '-0x1.c2fcfa0000000p+6', '-0x1.ec1c0e0000000p+1', '-0x1.223ccc0000000p+1', '-0x1.5bb52c0000000p+6',
]
UPSTREAM_GRAD = [
    '0x1.4f433c0000000p+2', '0x1.1ab0100000000p-1', '0x1.1ab0100000000p-1', '0x1.50cbbc0000000p+0',
    '0x1.44339e0000000p+3', '0x1.1ab0100000000p-1', '0x1.758d040000000p+0', '0x1.a3cb6e0000000p+1',
    '0x1.758d040000000p+0', '0x1.758d040000000p+0', '0x0.0p+0', '0x0.0p+0',
    '-0x1.eeb1020000000p-4', '-0x1.29e7f20000000p+0', '-0x1.8b53ea0000000p-1', '-0x1.6504e60000000p-2',
    '-0x1.29e7f20000000p+0', '-0x1.5ef69e0000000p-1', '0x1.96977e0000000p-1', '0x1.5323bc0000000p+2',
    '0x0.0p+0', '0x0.0p+0', '0x0.0p+0', '0x0.0p+0',
]
UPSTREAM_CLIPPED = [0, 1, 1, 0, 0, 1, 1, 0, 1, 1, 0, 1, 0, 1, 0, 0, 1, 0, 1, 0, 0, 0, 1, 0]
UPSTREAM_LOSS = '-0x1.480ece0000000p+1'
UPSTREAM_METRICS = {'pg_loss': '-0x1.480ece0000000p+1', 'ppo_kl': '0x1.64bccc0000000p-2', 'pg_clipfrac': '0x1.0000000000000p-1'}
UPSTREAM_LOSS_GRAD = [
    '0x1.2a02e00000000p-2', '0x1.f68e560000000p-6', '0x1.f68e560000000p-6', '0x1.2b5fc40000000p-4',
    '0x1.202de20000000p-1', '0x1.f68e560000000p-6', '0x1.4c0b920000000p-4', '0x1.75269a0000000p-3',
    '0x1.4c0b920000000p-4', '0x1.4c0b920000000p-4', '0x0.0p+0', '0x0.0p+0',
    '-0x1.b7b9ca0000000p-8', '-0x1.08ce2c0000000p-4', '-0x1.5f670a0000000p-5', '-0x1.3d59b00000000p-6',
    '-0x1.08ce2c0000000p-4', '-0x1.37f7aa0000000p-5', '0x1.696a380000000p-5', '0x1.2d751a0000000p-2',
    '0x0.0p+0', '0x0.0p+0', '0x0.0p+0', '0x0.0p+0',
]


def _pinned_inputs():
    """4 x 6, ratios far from 1 (log-ratio ~ N(0, 1.5)), advantages of both signs, two padded rows."""
    g = torch.Generator().manual_seed(22)
    n, t = 4, 6
    logp = (-torch.rand(n, t, generator=g, dtype=torch.float64) * 3).float()
    old = logp + (torch.randn(n, t, generator=g, dtype=torch.float64) * 1.5).float()
    adv = torch.randn(n, generator=g, dtype=torch.float64).float()[:, None].expand(n, t).contiguous()
    mask = torch.ones(n, t, dtype=torch.bool)
    mask[1, 4:] = False
    mask[3, 2:] = False
    return logp, old, adv, mask


def _hex(t: torch.Tensor) -> list[str]:
    return [v.hex() for v in t.detach().double().flatten().tolist()]


CONFIG = AlgorithmConfig(eps_clip=0.2, eps_clip_high=0.28)
UPSTREAM = CISPO.Config(eps_clip=0.2, eps_clip_high=0.28, cispo_rule="upstream")


def test_cispo_upstream_reproduces_the_previous_rule_bit_for_bit():
    logp, old, adv, mask = _pinned_inputs()
    algo = get_algorithm("cispo")(UPSTREAM)
    lp = logp.clone().requires_grad_(True)
    per_token, flags, _ = algo.surrogate(lp, lp.detach() - old, adv, mask)
    (per_token * mask).sum().backward()
    assert _hex(per_token) == UPSTREAM_PER_TOKEN
    assert _hex(lp.grad) == UPSTREAM_GRAD
    assert flags["pg_clipfrac"].int().flatten().tolist() == UPSTREAM_CLIPPED

    lp = logp.clone().requires_grad_(True)
    out = algo.policy_loss(PolicyLossInputs(log_probs=lp, old_log_probs=old, advantages=adv, response_mask=mask))
    out.loss.backward()
    assert out.loss.item().hex() == UPSTREAM_LOSS
    assert {k: float(v).hex() for k, v in out.metrics.items()} == UPSTREAM_METRICS
    assert _hex(lp.grad) == UPSTREAM_LOSS_GRAD


def _reference(logp, old, adv, eps_low, eps_high):
    """numpy float64: -clip(r, 1 - eps_low, 1 + eps_high) * A * logp and its gradient -w * A."""
    r = np.exp(logp.double().numpy() - old.double().numpy())
    w = np.clip(r, 1.0 - eps_low, 1.0 + eps_high)
    a, lp = adv.double().numpy(), logp.double().numpy()
    return -w * a * lp, -w * a, w


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cispo_is_the_papers_clipped_weight_on_every_token(seed):
    g = torch.Generator().manual_seed(seed)
    n, t = 16, 12
    logp = -torch.rand(n, t, generator=g) * 4
    old = logp + torch.randn(n, t, generator=g) * 2.0  # ratios from ~e^-6 to ~e^6
    adv = torch.randn(n, t, generator=g)  # per token: both signs everywhere
    mask = torch.ones(n, t, dtype=torch.bool)
    lp = logp.clone().requires_grad_(True)
    per_token, flags, _ = CISPO(CONFIG).surrogate(lp, lp.detach() - old, adv, mask)
    per_token.sum().backward()
    loss_ref, grad_ref, w = _reference(logp, old, adv, 0.2, 0.28)
    np.testing.assert_allclose(per_token.detach().double().numpy(), loss_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lp.grad.double().numpy(), grad_ref, rtol=1e-5, atol=1e-6)
    # the inputs exercise both bounds and both signs
    a = adv.numpy()
    assert ((a < 0) & (w == 1.28)).any() and ((a > 0) & (w == 0.8)).any() and ((w > 0.8) & (w < 1.28)).any()
    clipped = (w == 0.8) | (w == 1.28)
    assert (flags["pg_clipfrac"].numpy() == clipped).all()


def test_negative_advantage_with_a_huge_ratio_gets_exactly_one_plus_eps_high():
    logp = torch.tensor([[-1.0, -2.0, -0.5]])
    old = logp - torch.tensor([[math.log(109.0), 3.0, 8.0]])  # r = 109, e^3, e^8
    adv = torch.full((1, 3), -1.5)
    mask = torch.ones(1, 3, dtype=torch.bool)
    ratio = torch.exp(logp - old)
    weight, clipped = CISPO(CONFIG).importance_weight(ratio, adv)
    assert torch.equal(weight, torch.full((1, 3), 1.0 + 0.28))  # exactly the float32 of 1.28
    assert clipped.all()
    lp = logp.clone().requires_grad_(True)
    out = CISPO(CONFIG).policy_loss(PolicyLossInputs(log_probs=lp, old_log_probs=old, advantages=adv,
                                                     response_mask=mask))
    out.loss.backward()
    # token mean over 3 tokens: d/dlogp = -w A / 3 = 1.28 * 1.5 / 3, bounded whatever the ratio
    torch.testing.assert_close(lp.grad, torch.full((1, 3), 1.28 * 1.5 / 3), rtol=0, atol=1e-6)
    # the upstream rule keeps the whole ratio: the gradient grows with it
    lp = logp.clone().requires_grad_(True)
    CISPO(UPSTREAM).policy_loss(PolicyLossInputs(log_probs=lp, old_log_probs=old, advantages=adv,
                                               response_mask=mask)).loss.backward()
    torch.testing.assert_close(lp.grad, ratio * 1.5 / 3, rtol=1e-6, atol=0)
    assert float(lp.grad.max()) > 100 * 1.28 * 1.5 / 3


def test_eps_low_defaults_to_eps_clip_and_eps_high_to_eps_clip():
    # --eps-clip alone sets both bounds (eps_clip_high defaults to eps_clip)
    ratio = torch.tensor([0.5, 0.95, 1.5])
    weight, _ = CISPO(AlgorithmConfig(eps_clip=0.1)).importance_weight(ratio, torch.tensor([1.0, -1.0, -1.0]))
    assert weight.tolist() == pytest.approx([0.9, 0.95, 1.1])
    # a large eps_clip (the paper's eps_low) leaves only the upper bound
    weight, _ = CISPO(AlgorithmConfig(eps_clip=5.0, eps_clip_high=0.28)).importance_weight(ratio, -torch.ones(3))
    assert weight.tolist() == pytest.approx([0.5, 0.95, 1.28])


def test_the_rule_is_a_hyperparameter_of_cispo_with_the_paper_as_default():
    assert CISPO(CONFIG).config.cispo_rule == "paper"
    assert "cispo_rule" in CISPO.hyperparameters
    assert "eps_clip" in CISPO.hyperparameters and "eps_clip_high" in CISPO.hyperparameters
    assert "eps_clip_c" not in CISPO.hyperparameters
    with pytest.raises(ValueError, match="cispo_rule must be one of paper, upstream"):
        CISPO(CISPO.Config(cispo_rule="pape"))
