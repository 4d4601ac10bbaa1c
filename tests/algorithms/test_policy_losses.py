"""policy_loss of every built-in method: hand-computed per-token losses, every aggregation mode,
dual clip, KL estimators, entropy bonus, gradients, and masked positions holding NaN / huge values.

Base batch (N = 2, T = 3; row 0 has 2 valid tokens, row 1 has 3):

    d = log_probs - old_log_probs      row 0: ( 0.1, -0.5, pad)   A = +1
                                       row 1: ( 0.3,  0.0, -0.25) A = -2
    PPO clip (eps 0.2), L = max(-r A, -clip(r, 0.8, 1.2) A):
      row 0: r = e^0.1 = 1.105171 -> -1.105171 ; r = e^-0.5 = 0.606531 -> -0.606531 (unclipped)
      row 1: r = e^0.3 = 1.349859 ->  2.699718 ; r = 1 -> 2 ; r = e^-0.25 = 0.778801 -> 1.6 (clipped)
"""

import math

import pytest
import torch

from relax.algorithms import AlgorithmConfig, PolicyLossInputs, get_algorithm

NAN = float("nan")
MASK = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
LOG_PROBS = [[-1.0, -2.0, NAN], [-0.5, -1.5, -3.0]]
DELTA = [[0.1, -0.5, 0.0], [0.3, 0.0, -0.25]]
ADV = [[1.0, 1.0, 1e30], [-2.0, -2.0, -2.0]]
PPO_CLIP_FAMILY = ("grpo", "gdpo", "ppo", "reinforce_plus_plus", "reinforce_plus_plus_baseline")
MODES = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum")


def make(name, **config):
    if name == "gdpo":
        config.setdefault("reward_keys", ("a", "b"))
    if name.startswith("reinforce"):
        config.setdefault("normalize_advantages", True)
    cls = get_algorithm(name)
    return cls(cls.Config(**config))


def batch(log_probs=LOG_PROBS, delta=DELTA, adv=ADV, mask=MASK, requires_grad=False, **kw):
    logp = torch.tensor(log_probs, requires_grad=requires_grad)
    old = torch.tensor(log_probs) - torch.tensor(delta)
    old[~mask] = NAN
    return PolicyLossInputs(
        log_probs=logp, old_log_probs=old, advantages=torch.tensor(adv), response_mask=mask, **kw
    ), logp


def rows(values, mask=MASK):
    """[N, T] nested list -> list of per-row lists of the valid values."""
    return [[v for v, m in zip(r, mr) if m] for r, mr in zip(values, mask.tolist())]


def agg(per_token_rows, mode, gnt=None, gns=None):
    """Independent plain-Python loss aggregation over per-row lists of valid-token values."""
    if mode == "token_mean":
        n = sum(len(r) for r in per_token_rows)
        return sum(sum(r) for r in per_token_rows) / (gnt if gnt is not None else n)
    per_seq = [sum(r) / len(r) if mode == "seq_mean_token_mean" else sum(r) for r in per_token_rows]
    return sum(per_seq) / (gns if gns is not None else len(per_seq))


def ppo_token(d, a, eps_low=0.2, eps_high=0.2, c=None):
    r = math.exp(d)
    loss = max(-r * a, -min(max(r, 1 - eps_low), 1 + eps_high) * a)
    if c is not None and a < 0:
        loss = min(loss, -c * a)
    return loss


def expected_rows(fn, delta=DELTA, adv=ADV, mask=MASK):
    return [[fn(d, a) for d, a in zip(rd, ra)] for rd, ra in zip(rows(delta, mask), rows(adv, mask))]


# -- PPO clip (GRPO, GDPO, PPO, REINFORCE++ and -baseline share it) --


def test_ppo_token_losses_written_out():
    got = expected_rows(ppo_token)
    assert got[0] == pytest.approx([-1.105171, -0.606531], abs=1e-6)
    assert got[1] == pytest.approx([2.699718, 2.0, 1.6], abs=1e-6)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", PPO_CLIP_FAMILY)
def test_ppo_clip_every_aggregation(name, mode):
    inputs, _ = batch()
    out = make(name, loss_aggregation=mode).policy_loss(inputs)
    expected = agg(expected_rows(ppo_token), mode)
    assert out.loss.item() == pytest.approx(expected, abs=1e-6)
    assert torch.isfinite(out.loss)


def test_aggregation_golden_numbers():
    # token_mean = (-1.711702 + 6.299718) / 5; seq means: (-0.855851 + 2.099906) / 2; seq sums / 2
    inputs, _ = batch()
    for mode, value in [("token_mean", 0.917603), ("seq_mean_token_mean", 0.622027), ("seq_mean_token_sum", 2.294008)]:
        assert make("grpo", loss_aggregation=mode).policy_loss(inputs).loss.item() == pytest.approx(value, abs=1e-6)


@pytest.mark.parametrize("mode, gnt, gns", [("token_mean", 10, None), ("seq_mean_token_mean", None, 4),
                                            ("seq_mean_token_sum", None, 4)])
def test_global_divisors_replace_local_counts(mode, gnt, gns):
    inputs, _ = batch(global_num_tokens=gnt, global_num_sequences=gns)
    out = make("grpo", loss_aggregation=mode).policy_loss(inputs)
    assert out.loss.item() == pytest.approx(agg(expected_rows(ppo_token), mode, gnt, gns), abs=1e-6)


def test_micro_batch_losses_with_global_divisor_add_up_to_the_full_batch_loss():
    full, _ = batch()
    algo = make("grpo")
    parts = []
    for i in range(2):
        sl = slice(i, i + 1)
        part, _ = batch([LOG_PROBS[i]], [DELTA[i]], [ADV[i]], MASK[sl], global_num_tokens=5)
        parts.append(algo.policy_loss(part).loss)
    assert (parts[0] + parts[1]).item() == pytest.approx(algo.policy_loss(full).loss.item(), abs=1e-6)


def test_asymmetric_clip_uses_eps_clip_high():
    # row 0 token 0 with d = 0.3, A = +1: clipped at 1 + eps_high
    inputs, _ = batch(delta=[[0.3, 0.0, 0.0], [0.0, 0.0, 0.0]], adv=[[1.0, 1.0, 0], [0.0, 0.0, 0.0]])
    low = make("grpo").policy_loss(inputs).loss.item()
    high = make("grpo", eps_clip_high=0.28).policy_loss(inputs).loss.item()
    assert low == pytest.approx((-1.2 - 1.0) / 5, abs=1e-6)
    assert high == pytest.approx((-1.28 - 1.0) / 5, abs=1e-6)


def test_dual_clip_caps_negative_advantage_losses():
    inputs, _ = batch()
    plain = make("grpo").policy_loss(inputs)
    dual = make("grpo", eps_clip_c=1.3).policy_loss(inputs)
    # only row 1 token 0 changes: min(2.699718, 1.3 * 2) = 2.6
    expected = agg(expected_rows(lambda d, a: ppo_token(d, a, c=1.3)), "token_mean")
    assert dual.loss.item() == pytest.approx(expected, abs=1e-6)
    assert plain.loss.item() - dual.loss.item() == pytest.approx((2.699718 - 2.6) / 5, abs=1e-6)
    assert dual.metrics["dual_clipfrac"].item() == pytest.approx(1 / 5)
    # dual clip never touches positive advantages: a huge ratio with A > 0 is the ordinary clip
    pos, _ = batch(delta=[[3.0, 3.0, 0], [0, 0, 0]], adv=[[1.0, 1.0, 0], [1.0, 1.0, 1.0]])
    assert make("grpo", eps_clip_c=1.3).policy_loss(pos).loss.item() == pytest.approx(
        make("grpo").policy_loss(pos).loss.item()
    )


def test_ppo_clip_gradient_and_metrics():
    inputs, logp = batch(requires_grad=True)
    out = make("grpo").policy_loss(inputs)
    out.loss.backward()
    # unclipped tokens: d(-r A)/dlogp = -r A / 5 ; clipped tokens: 0; padding: 0
    r = [[math.exp(d) for d in row] for row in DELTA]
    expected = torch.tensor([[-r[0][0] / 5, -r[0][1] / 5, 0.0], [2 * r[1][0] / 5, 2 * r[1][1] / 5, 0.0]])
    torch.testing.assert_close(logp.grad, expected, rtol=0, atol=1e-6)
    assert out.metrics["pg_clipfrac"].item() == pytest.approx(1 / 5)
    # ppo_kl = mean over valid tokens of (old - new) = -(0.1 - 0.5 + 0.3 + 0 - 0.25) / 5
    assert out.metrics["ppo_kl"].item() == pytest.approx(0.07, abs=1e-6)
    for name, value in out.metrics.items():
        assert value.dim() == 0 and not value.requires_grad, name


def test_masked_positions_never_contribute():
    clean, _ = batch()
    dirty_lp = [[-1.0, -2.0, 1e30], [-0.5, -1.5, -3.0]]
    dirty, _ = batch(log_probs=dirty_lp, adv=[[1.0, 1.0, NAN], [-2.0, -2.0, -2.0]],
                     entropy=torch.tensor([[0.5, 0.5, NAN], [1.0, 1.0, 1.0]]),
                     ref_log_probs=torch.tensor([[-1.0, -2.0, NAN], [-0.5, -1.5, -3.0]]))
    for name in ("grpo", "gspo", "sapo", "cispo", "rloo", "m2po", "ppo"):
        for mode in MODES:
            cfg = dict(loss_aggregation=mode, entropy_coef=0.01, use_kl_loss=True, kl_loss_coef=0.1)
            a = make(name, **cfg).policy_loss(dirty).loss
            clean_in, _ = batch(entropy=torch.tensor([[0.5, 0.5, 0.0], [1.0, 1.0, 1.0]]),
                                ref_log_probs=torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -1.5, -3.0]]))
            b = make(name, **cfg).policy_loss(clean_in).loss
            assert torch.isfinite(a) and a.item() == pytest.approx(b.item(), abs=1e-6), (name, mode)


def test_padding_gradient_is_exactly_zero_with_large_finite_padding():
    lp = [[-1.0, -2.0, 40.0], [-0.5, -1.5, -3.0]]
    for name in ("grpo", "gspo", "sapo", "cispo", "rloo", "m2po"):
        inputs, logp = batch(log_probs=lp, requires_grad=True)
        make(name).policy_loss(inputs).loss.backward()
        assert logp.grad[0, 2].item() == 0.0, name
        assert torch.isfinite(logp.grad).all(), name


# -- KL loss and entropy bonus --


def kl_value(d, kind):
    if kind == "k1":
        return d
    if kind == "k2":
        return d * d / 2
    k3 = math.exp(-d) - 1 + d
    return max(min(k3, 10.0), -10.0) if kind == "low_var_kl" else k3


REF_D = [[0.5, -3.0, 0.0], [0.2, 0.0, 1.0]]  # log_probs - ref_log_probs; -3.0 is clamped by low_var_kl


def test_kl_estimator_values_written_out():
    assert kl_value(-3.0, "k3") == pytest.approx(16.085537, abs=1e-6)
    assert kl_value(-3.0, "low_var_kl") == 10.0
    assert kl_value(0.5, "k2") == 0.125
    assert kl_value(0.5, "k3") == pytest.approx(0.106531, abs=1e-6)


@pytest.mark.parametrize("kind", ["k1", "k2", "k3", "low_var_kl"])
@pytest.mark.parametrize("mode", MODES)
def test_kl_loss_term(kind, mode):
    ref = torch.tensor(LOG_PROBS) - torch.tensor(REF_D)
    inputs, _ = batch(ref_log_probs=ref)
    out = make("grpo", use_kl_loss=True, kl_loss_coef=0.5, kl_loss_type=kind, loss_aggregation=mode).policy_loss(inputs)
    kl = agg(rows([[kl_value(d, kind) for d in row] for row in REF_D]), mode)
    pg = agg(expected_rows(ppo_token), mode)
    assert out.metrics["kl_loss"].item() == pytest.approx(kl, abs=1e-5)
    assert out.loss.item() == pytest.approx(pg + 0.5 * kl, abs=1e-5)


def test_kl_loss_gradient_flows_through_log_probs_only():
    ref = torch.tensor(LOG_PROBS) - torch.tensor(REF_D)
    inputs, logp = batch(ref_log_probs=ref, adv=[[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]], requires_grad=True)
    make("grpo", use_kl_loss=True, kl_loss_coef=0.5, kl_loss_type="k2").policy_loss(inputs).loss.backward()
    # d/dlogp of 0.5 * mean(d^2 / 2) = 0.5 * d / 5
    expected = torch.tensor([[0.05, -0.3, 0.0], [0.02, 0.0, 0.1]])
    torch.testing.assert_close(logp.grad, expected, rtol=0, atol=1e-6)


def test_kl_loss_with_zero_coefficient_needs_no_reference():
    config = AlgorithmConfig(use_kl_loss=True, kl_loss_coef=0.0)
    assert not config.uses_reference  # what decides whether a reference model runs
    inputs, _ = batch()
    out = get_algorithm("grpo")(config).policy_loss(inputs)
    assert out.loss.item() == pytest.approx(agg(expected_rows(ppo_token), "token_mean"), abs=1e-6)


def test_kl_loss_without_reference_is_an_error():
    inputs, _ = batch()
    with pytest.raises(ValueError, match="ref_log_probs"):
        make("grpo", use_kl_loss=True, kl_loss_coef=0.1).policy_loss(inputs)


@pytest.mark.parametrize("mode", MODES)
def test_entropy_bonus(mode):
    entropy = [[0.5, 1.5, 7.0], [1.0, 2.0, 3.0]]
    inputs, _ = batch(entropy=torch.tensor(entropy))
    out = make("grpo", entropy_coef=0.01, loss_aggregation=mode).policy_loss(inputs)
    h = agg(rows(entropy), mode)
    assert out.metrics["entropy"].item() == pytest.approx(h, abs=1e-6)
    assert out.loss.item() == pytest.approx(agg(expected_rows(ppo_token), mode) - 0.01 * h, abs=1e-6)


def test_entropy_coef_without_entropy_is_an_error():
    inputs, _ = batch()
    with pytest.raises(ValueError, match="entropy"):
        make("grpo", entropy_coef=0.01).policy_loss(inputs)


# -- GSPO: one ratio per sequence, exp(mean_t d_t) --


def test_gspo_sequence_ratio_value_and_gradient():
    # row 0: d = (0.5, 0.1) -> s = e^0.3 = 1.349859, A = +1 -> clipped at -1.2 on both tokens
    # row 1: d = (0.6, 0.3, 0.3) -> s = e^0.4 = 1.491825, A = -2 -> 2 s = 2.983649 on every token
    inputs, logp = batch(delta=[[0.5, 0.1, 0.0], [0.6, 0.3, 0.3]], requires_grad=True)
    out = make("gspo").policy_loss(inputs)
    s1 = math.exp(0.4)
    assert out.loss.item() == pytest.approx((2 * -1.2 + 3 * 2 * s1) / 5, abs=1e-6)
    out.loss.backward()
    # d/dlogp_{1,t}: sum over the 3 tokens of 2 s / 5 times ds/dlogp_t = s / 3 -> 2 s / 5 each
    # (a token-level ratio would give 2 e^{d_t} / 5, different per token)
    expected = torch.tensor([[0.0, 0.0, 0.0], [2 * s1 / 5] * 3])
    torch.testing.assert_close(logp.grad, expected, rtol=0, atol=1e-6)
    # seq_mean_token_mean of the same per-token losses
    mean_mode = make("gspo", loss_aggregation="seq_mean_token_mean").policy_loss(inputs).loss.item()
    assert mean_mode == pytest.approx((-1.2 + 2 * s1) / 2, abs=1e-6)


# -- SAPO: soft gate (4 / tau) sigmoid(tau (r - 1)) --


def sapo_token(d, a, tau_pos=1.0, tau_neg=1.05):
    tau = tau_pos if a > 0 else tau_neg
    return -(4 / tau) / (1 + math.exp(-tau * (math.exp(d) - 1))) * a


@pytest.mark.parametrize("mode", MODES)
def test_sapo_soft_gate(mode):
    inputs, _ = batch()
    out = make("sapo", loss_aggregation=mode).policy_loss(inputs)
    assert sapo_token(0.1, 1.0) == pytest.approx(-2.105074, abs=1e-6)
    assert out.loss.item() == pytest.approx(agg(expected_rows(sapo_token), mode), abs=1e-6)
    custom = make("sapo", sapo_tau_pos=2.0, sapo_tau_neg=0.5).policy_loss(inputs).loss.item()
    assert custom == pytest.approx(
        agg(expected_rows(lambda d, a: sapo_token(d, a, 2.0, 0.5)), "token_mean"), abs=1e-6
    )


def test_sapo_gradient_on_policy_equals_the_plain_policy_gradient():
    # at r = 1 the gate's slope is 1: d/dlogp = -A / n_tokens, like PPO without clipping
    inputs, logp = batch(delta=[[0.0] * 3] * 2, requires_grad=True)
    make("sapo").policy_loss(inputs).loss.backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.2, -0.2, 0.0], [0.4, 0.4, 0.4]]), rtol=0, atol=1e-6)


# -- CISPO: -sg(clip(r)) * A * logp --

# eps 0.2, eps_high 0.28. row 0 (A = +1): d = (0.3, -0.5); row 1 (A = -2): d = (0.3, 0, -0.25).
# cispo (the paper): clip(r, 0.8, 1.28) on every token -> (1.28, 0.8), (1.28, 1, 0.8).
# --cispo-rule upstream: min(r, 1.28) for A >= 0, max(r, 0.8) for A < 0 -> (1.28, 0.606531), (1.349859, 1, 0.8).
CISPO_WEIGHTS = {
    "paper": ([[1.28, 0.8], [1.28, 1.0, 0.8]], [1.28, 1.6], [-1.28, -3.0, -4.8], [[1.0, 1.0], [1.0, 0.0, 1.0]]),
    "upstream": ([[1.28, math.exp(-0.5)], [math.exp(0.3), 1.0, 0.8]], [1.28, 1.213061],
                       [-1.349859, -3.0, -4.8], [[1.0, 0.0], [0.0, 0.0, 1.0]]),
}


@pytest.mark.parametrize("rule", sorted(CISPO_WEIGHTS))
@pytest.mark.parametrize("mode", MODES)
def test_cispo_value_and_gradient(mode, rule):
    w, row0, row1, clipped = CISPO_WEIGHTS[rule]
    delta = [[0.3, -0.5, 0.0], [0.3, 0.0, -0.25]]
    inputs, logp = batch(delta=delta, requires_grad=True)
    out = make("cispo", eps_clip_high=0.28, loss_aggregation=mode, cispo_rule=rule).policy_loss(inputs)
    a = rows(ADV)
    lp = rows(LOG_PROBS)
    per_token = [[-w[i][t] * a[i][t] * lp[i][t] for t in range(len(w[i]))] for i in range(2)]
    assert per_token[0] == pytest.approx(row0, abs=1e-6)
    assert per_token[1] == pytest.approx(row1, abs=1e-6)
    assert out.loss.item() == pytest.approx(agg(per_token, mode), abs=1e-6)
    out.loss.backward()
    # the weight is a constant: d/dlogp = -w A / divisor, also on clipped tokens (CISPO keeps them)
    if mode == "token_mean":
        expected = [[-w[0][0] / 5, -w[0][1] / 5, 0.0], [2 * w[1][0] / 5, 2 * w[1][1] / 5, 2 * w[1][2] / 5]]
        torch.testing.assert_close(logp.grad, torch.tensor(expected), rtol=0, atol=1e-6)
    assert out.metrics["pg_clipfrac"].item() == pytest.approx(agg(clipped, mode), abs=1e-6)


# -- RLOO: -sg(A) * logp, no ratio --


@pytest.mark.parametrize("mode", MODES)
def test_rloo_reinforce_loss(mode):
    inputs, logp = batch(requires_grad=True)
    out = make("rloo", loss_aggregation=mode).policy_loss(inputs)
    per_token = [[-a * l for a, l in zip(ra, rl)] for ra, rl in zip(rows(ADV), rows(LOG_PROBS))]
    assert per_token == [[1.0, 2.0], [-1.0, -3.0, -6.0]]
    assert out.loss.item() == pytest.approx(agg(per_token, mode), abs=1e-6)
    out.loss.backward()
    if mode == "token_mean":
        expected = torch.tensor([[-0.2, -0.2, 0.0], [0.4, 0.4, 0.4]])
        torch.testing.assert_close(logp.grad, expected, rtol=0, atol=1e-7)
    assert out.metrics["pg_clipfrac"].item() == 0.0


# -- M2PO: second-moment trust region --


M2PO_DELTA = [[0.05, 0.1, 0.2, 0.4, -0.3]]  # A = +1 on all: the first four are "harmful" (r > 1)
M2PO_MASK = torch.ones(1, 5, dtype=torch.bool)


def test_m2po_clip_range_from_the_second_moment():
    # harmful delta^2 = (0.0025, 0.01, 0.04, 0.16): M2 = 0.053125 > budget 0.01.
    # target = 0.01 * 4 = 0.04; clamped sums S_k = csum_k + (4 - k - 1) d_k = 0.01, 0.0325, 0.0925 -> k = 2;
    # tau = sqrt(d_{k-1} - 1e-12) ~= 0.1 (previous breakpoint); M2_after = (0.01 * 2 + 0.0125) / 4.
    inputs, _ = batch([[-1.0] * 5], M2PO_DELTA, [[1.0] * 5], M2PO_MASK)
    out = make("m2po", m2po_kl2_budget=0.01, m2po_miniclip_low=0.0, m2po_miniclip_high=0.0).policy_loss(inputs)
    tau = math.sqrt(0.01 - 1e-12)
    eps_low, eps_high = 1 - math.exp(-tau), math.exp(tau) - 1
    assert out.metrics["m2_before"].item() == pytest.approx(0.053125, rel=1e-6)
    assert out.metrics["m2_after"].item() == pytest.approx(0.008125, rel=1e-6)
    assert out.metrics["eps_low"].item() == pytest.approx(eps_low, rel=1e-6)
    assert out.metrics["eps_high"].item() == pytest.approx(eps_high, rel=1e-6)
    per_token = [ppo_token(d, 1.0, eps_low, eps_high) for d in M2PO_DELTA[0]]
    # delta 0.05 is inside the band, 0.1/0.2/0.4 are clipped at 1 + eps_high, -0.3 keeps its (lower) value
    assert per_token == pytest.approx([-math.exp(0.05), -math.exp(0.1), -math.exp(0.1), -math.exp(0.1),
                                       -math.exp(-0.3)], abs=1e-9)
    assert out.loss.item() == pytest.approx(sum(per_token) / 5, abs=1e-6)


def test_m2po_miniclip_floors_the_range():
    inputs, _ = batch([[-1.0] * 5], M2PO_DELTA, [[1.0] * 5], M2PO_MASK)
    out = make("m2po", m2po_kl2_budget=0.01).policy_loss(inputs)  # floors 0.3 / 0.5 dominate tau ~ 0.1
    assert out.metrics["eps_low"].item() == pytest.approx(0.3)
    assert out.metrics["eps_high"].item() == pytest.approx(0.5)
    expected = sum(ppo_token(d, 1.0, 0.3, 0.5) for d in M2PO_DELTA[0]) / 5
    assert out.loss.item() == pytest.approx(expected, abs=1e-6)


def test_m2po_under_budget_does_not_clip():
    # M2 = (0.0025 + 0.01 + 0.04 + 0.16 + 4) / 5 = 0.8425 <= budget 1: plain -r A even for r = e^2
    delta = [[0.05, 0.1, 0.2, 0.4, 2.0]]
    inputs, _ = batch([[-1.0] * 5], delta, [[1.0] * 5], M2PO_MASK)
    out = make("m2po", m2po_kl2_budget=1.0).policy_loss(inputs)
    assert out.loss.item() == pytest.approx(-sum(math.exp(d) for d in delta[0]) / 5, rel=1e-6)
