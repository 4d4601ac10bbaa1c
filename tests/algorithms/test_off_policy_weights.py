"""Length-safe sequence weights (``--off-policy-correction seq_geo_tis``), the per-step weight
diagnostics (``numerics.unit_log_weights`` / ``weight_statistics``, logged as ``off_policy/*``) and
the ``abs`` KL estimator, against hand-computed values and float64 references written with loops."""

from __future__ import annotations

import math

import pytest
import torch

from relax.algorithms import AlgorithmConfig, PolicyLossInputs, get_algorithm, numerics
from relax.runtime.metrics.actor_metrics import off_policy_weight_metrics

MASK = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0]], dtype=torch.bool)
# log w = proximal - behaviour per token; padding holds garbage that must not count
LOG_W = [[0.2, 0.3, -0.1], [0.5, 0.6, 9.0], [-1.5, 7.0, 7.0]]


def _logs():
    behaviour = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.2, -1.0], [-2.0, -1.0, -1.0]])
    return behaviour + torch.tensor(LOG_W), behaviour


# -- seq_geo_tis ------------------------------------------------------------------------------------


def test_seq_geo_tis_weighs_every_token_by_the_truncated_geometric_mean():
    proximal, behaviour = _logs()
    weight, capped = numerics.behaviour_weights(proximal, behaviour, "seq_geo_tis", 1.5, mask=MASK)
    # g_0 = e^(0.4 / 3) = 1.1426; g_1 = e^(1.1 / 2) = 1.733 -> 1.5; g_2 = e^-1.5 = 0.2231
    expected = [math.exp(0.4 / 3), 1.5, math.exp(-1.5)]
    for i, w in enumerate(expected):
        assert weight[i].tolist() == pytest.approx([w] * 3, rel=1e-6)
    assert capped[:, 0].tolist() == [False, True, False]


def test_a_long_sequence_keeps_its_weight_where_the_product_collapses():
    # 4000 tokens, each 0.1 % less likely under the trainer: the product is e^-4 = 0.018 (the whole
    # sequence silenced), the geometric mean e^-0.001 = 0.999
    behaviour = torch.zeros(1, 4000)
    proximal = torch.full((1, 4000), -0.001)
    mask = torch.ones(1, 4000, dtype=torch.bool)
    product, _ = numerics.behaviour_weights(proximal, behaviour, "seq_tis", 2.0, mask=mask)
    geo, _ = numerics.behaviour_weights(proximal, behaviour, "seq_geo_tis", 2.0, mask=mask)
    assert float(product[0, 0]) == pytest.approx(math.exp(-4.0), rel=1e-4)
    assert float(geo[0, 0]) == pytest.approx(math.exp(-0.001), rel=1e-6)


def test_policy_loss_with_seq_geo_tis_by_hand():
    proximal, behaviour = _logs()
    logp = proximal.clone().requires_grad_(True)  # ratio 1: the PPO clip is inactive, per-token loss -A
    adv = torch.tensor([[1.0] * 3, [-2.0] * 3, [0.5] * 3])
    algo = get_algorithm("grpo")(AlgorithmConfig(off_policy_correction="seq_geo_tis", off_policy_cap=1.5))
    out = algo.policy_loss(PolicyLossInputs(log_probs=logp, old_log_probs=proximal.clone(), advantages=adv,
                                            response_mask=MASK, rollout_log_probs=behaviour))
    g = [math.exp(0.4 / 3), 1.5, math.exp(-1.5)]
    # token_mean over 6 valid tokens of -A_i * g_i
    expected = (3 * -1.0 * g[0] + 2 * 2.0 * g[1] + 1 * -0.5 * g[2]) / 6
    assert float(out.loss.detach()) == pytest.approx(expected, rel=1e-6)
    assert float(out.metrics["off_policy_capped_frac"]) == pytest.approx(2 / 6)  # sequence 1's 2 tokens
    assert float(out.metrics["off_policy_weight"]) == pytest.approx((3 * g[0] + 2 * g[1] + g[2]) / 6, rel=1e-6)


# -- the per-step diagnostics ------------------------------------------------------------------------


def test_units_are_tokens_or_sequences_as_the_mode_weighs_them():
    proximal, behaviour = _logs()
    tokens = numerics.unit_log_weights(proximal, behaviour, MASK, "tis")
    assert tokens.dtype == torch.float64
    assert tokens.tolist() == pytest.approx([0.2, 0.3, -0.1, 0.5, 0.6, -1.5], abs=1e-6)
    assert numerics.unit_log_weights(proximal, behaviour, MASK, "seq_tis").tolist() == pytest.approx(
        [0.4, 1.1, -1.5], abs=1e-6)
    for mode in ("seq_geo_tis", "seq_mask_tis"):
        assert numerics.unit_log_weights(proximal, behaviour, MASK, mode).tolist() == pytest.approx(
            [0.4 / 3, 0.55, -1.5], abs=1e-6)
    # a sequence without a valid token is no unit
    empty_row = MASK.clone()
    empty_row[2] = False
    assert numerics.unit_log_weights(proximal, behaviour, empty_row, "seq_tis").numel() == 2


def _reference_statistics(log_w: list[float], mode: str, cap: float) -> dict[str, float]:
    """float64 loops: quantiles of the log-weights with linear interpolation (numpy's default),
    exponentiated; Kish's effective sample size over n; the share beyond the cap."""
    x = sorted(log_w)
    n = len(x)

    def quantile(q):
        pos = q * (n - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, n - 1)
        return math.exp(x[lo] + (pos - lo) * (x[hi] - x[lo]))

    w = [math.exp(v) for v in log_w]
    ess = sum(w) ** 2 / (n * sum(v * v for v in w))
    if mode == "seq_mask_tis":
        beyond = sum(1 for v in w if v > cap or v < 1 / cap)
    else:
        beyond = sum(1 for v in w if v > cap)
    return {"weight_p50": quantile(0.5), "weight_p99": quantile(0.99), "weight_max": max(w),
            "weight_ess": ess, "capped_share": beyond / n}


@pytest.mark.parametrize("mode", ["tis", "seq_tis", "seq_mask_tis"])
def test_weight_statistics_match_the_float64_reference(mode):
    g = torch.Generator().manual_seed(5)
    log_w = (torch.randn(37, generator=g, dtype=torch.float64) * 0.6).tolist()
    got = numerics.weight_statistics(torch.tensor(log_w, dtype=torch.float64), mode, 1.8)
    want = _reference_statistics(log_w, mode, 1.8)
    assert set(got) == set(want)
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-9), key
    assert 0.0 < got["capped_share"] < 1.0 and 0.0 < got["weight_ess"] < 1.0


def test_weight_statistics_by_hand():
    # weights 1, 1, 4: p50 = 1, ESS = 36 / (3 * 18) = 2/3, one of three above the cap 2
    got = numerics.weight_statistics(torch.log(torch.tensor([1.0, 4.0, 1.0], dtype=torch.float64)), "tis", 2.0)
    assert got["weight_p50"] == pytest.approx(1.0)
    assert got["weight_max"] == pytest.approx(4.0)
    assert got["weight_ess"] == pytest.approx(2 / 3)
    assert got["capped_share"] == pytest.approx(1 / 3)
    # on-policy: every weight 1
    on = numerics.weight_statistics(torch.zeros(10, dtype=torch.float64), "seq_tis", 2.0)
    assert on == {"weight_p50": 1.0, "weight_p99": 1.0, "weight_max": 1.0, "weight_ess": 1.0, "capped_share": 0.0}
    assert numerics.weight_statistics(torch.zeros(0, dtype=torch.float64), "tis", 2.0) == {}


def test_a_product_beyond_float64_stays_a_finite_ess():
    # the product of 2000 ratios of e^0.5: W = e^1000 overflows float64; the ESS is computed in log space
    got = numerics.weight_statistics(torch.tensor([1000.0, 0.0], dtype=torch.float64), "seq_tis", 2.0)
    assert got["weight_ess"] == pytest.approx(0.5) and got["capped_share"] == 0.5


def test_the_actor_metric_reads_the_shard_and_names_the_metrics():
    proximal, behaviour = _logs()

    class Batch:
        response_mask = MASK

    shard = {"batch": Batch(), "old_log_probs": proximal, "fields": {"rollout_log_probs": behaviour}}
    config = AlgorithmConfig(off_policy_correction="seq_geo_tis", off_policy_cap=1.5)
    got = off_policy_weight_metrics(shard, config)
    want = numerics.weight_statistics(torch.tensor([0.4 / 3, 0.55, -1.5], dtype=torch.float64), "seq_geo_tis", 1.5)
    assert got == {f"off_policy/{k}": pytest.approx(v) for k, v in want.items()}
    assert got["off_policy/capped_share"] == pytest.approx(1 / 3)
    assert off_policy_weight_metrics({"batch": None, "fields": {}}, config) == {}  # a rank without rows


# -- abs KL -----------------------------------------------------------------------------------------

D = [0.5, -1.0, 2.0, -0.25]  # logp - logp_ref


def test_abs_kl_value_and_gradient():
    logp = torch.tensor([[-1.0, -2.0, -0.5, -3.0]], requires_grad=True)
    ref = logp.detach() - torch.tensor([D])
    kl = numerics.kl_estimate(logp, ref, "abs")
    assert kl[0].tolist() == pytest.approx([abs(d) for d in D], rel=1e-6)
    kl.sum().backward()
    assert logp.grad[0].tolist() == [1.0, -1.0, 1.0, -1.0]  # sign(d)


def test_abs_kl_loss_term_through_policy_loss():
    logp = torch.tensor([[-1.0, -2.0, -0.5, -3.0], [-0.2, -0.7, -0.1, -0.4]], requires_grad=True)
    ref = logp.detach() - torch.tensor([D, D])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)
    inputs = PolicyLossInputs(log_probs=logp, old_log_probs=logp.detach().clone(), advantages=torch.zeros(2, 4),
                              response_mask=mask, ref_log_probs=ref)
    out = get_algorithm("grpo")(AlgorithmConfig(use_kl_loss=True, kl_loss_coef=0.5, kl_loss_type="abs")).policy_loss(inputs)
    valid = D + D[:2]
    assert out.metrics["kl_loss"].item() == pytest.approx(sum(abs(d) for d in valid) / 6, rel=1e-6)
    out.loss.backward()
    sign = [math.copysign(1.0, d) for d in D]
    expected = torch.tensor([[0.5 * s / 6 for s in sign], [0.5 * sign[0] / 6, 0.5 * sign[1] / 6, 0.0, 0.0]])
    torch.testing.assert_close(logp.grad, expected, rtol=0, atol=1e-7)
