"""Rollout correction beyond token TIS: sequence-level importance sampling (``seq_tis``), masked
importance sampling with sequence rejection (``seq_mask_tis``) and the behaviour / trainer mismatch
diagnostics, against hand-computed values."""

import math

import pytest
import torch

from relax.algorithms import AlgorithmConfig, PolicyLossInputs, get_algorithm, numerics

MASK = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0]], dtype=torch.bool)
# log w = proximal - behaviour per token; padding holds garbage that must not count
LOG_W = [[0.2, 0.3, -0.1], [0.5, 0.6, 9.0], [-1.5, 7.0, 7.0]]


def _logs():
    behaviour = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.2, -1.0], [-2.0, -1.0, -1.0]])
    return behaviour + torch.tensor(LOG_W), behaviour


def test_seq_tis_weighs_every_token_by_the_truncated_product_of_the_ratios():
    proximal, behaviour = _logs()
    weight, capped = numerics.behaviour_weights(proximal, behaviour, "seq_tis", 2.0, mask=MASK)
    # W_0 = e^(0.2 + 0.3 - 0.1) = e^0.4 = 1.4918; W_1 = e^1.1 = 3.004 -> 2; W_2 = e^-1.5 = 0.2231
    expected = [math.exp(0.4), 2.0, math.exp(-1.5)]
    for i, w in enumerate(expected):
        assert weight[i].tolist() == pytest.approx([w] * 3, rel=1e-6)  # (padding is masked by the caller)
    assert capped[:, 0].tolist() == [False, True, False]


def test_seq_mask_tis_rejects_sequences_whose_geometric_mean_leaves_the_band():
    proximal, behaviour = _logs()
    weight, flagged = numerics.behaviour_weights(proximal, behaviour, "seq_mask_tis", 1.5, mask=MASK)
    # g_0 = e^(0.4 / 3) = 1.1426 in [1/1.5, 1.5]: kept, token TIS min(w, 1.5)
    assert weight[0].tolist() == pytest.approx([math.exp(0.2), math.exp(0.3), math.exp(-0.1)], rel=1e-6)
    # g_1 = e^(1.1 / 2) = 1.733 > 1.5: rejected; g_2 = e^-1.5 = 0.223 < 1/1.5: rejected
    assert weight[1].tolist() == [0.0, 0.0, 0.0] and weight[2].tolist() == [0.0, 0.0, 0.0]
    assert flagged[0].tolist() == [False, False, False] and flagged[1].all() and flagged[2].all()
    # a wider band keeps sequence 1, whose tokens are then capped one by one: min(e^0.5, 2), min(e^0.6, 2)
    weight, flagged = numerics.behaviour_weights(proximal, behaviour, "seq_mask_tis", 2.0, mask=MASK)
    assert weight[1, :2].tolist() == pytest.approx([math.exp(0.5), math.exp(0.6)], rel=1e-6)
    assert weight[2].tolist() == [0.0, 0.0, 0.0]  # 0.223 < 1/2 still


def test_sequence_modes_need_the_mask_and_token_modes_are_unchanged():
    proximal, behaviour = _logs()
    with pytest.raises(ValueError, match="response mask"):
        numerics.behaviour_weights(proximal, behaviour, "seq_tis", 2.0)
    w, capped = numerics.behaviour_weights(proximal, behaviour, "tis", 2.0, mask=MASK)
    assert torch.equal(w, torch.exp(proximal - behaviour).clamp(max=2.0))
    assert torch.equal(capped, torch.exp(proximal - behaviour) > 2.0)


def test_mismatch_diagnostics_by_hand():
    proximal, behaviour = _logs()
    m = numerics.mismatch_metrics(proximal, behaviour, MASK)
    k3 = [[math.exp(d) - 1 - d for d in row] for row in LOG_W]
    assert m["mismatch_kl"][0].tolist() == pytest.approx(k3[0], rel=1e-5)
    assert m["mismatch_kl"][1].tolist() == pytest.approx(k3[1][:2] + [0.0], rel=1e-5)
    assert m["mismatch_kl"][2].tolist() == pytest.approx([k3[2][0], 0.0, 0.0], rel=1e-5)
    # PPL_trainer / PPL_behaviour = exp(mean_t (behaviour - proximal)) on each valid token
    ratios = [math.exp(-0.4 / 3), math.exp(-1.1 / 2), math.exp(1.5)]
    assert m["mismatch_ppl_ratio"][0].tolist() == pytest.approx([ratios[0]] * 3, rel=1e-6)
    assert m["mismatch_ppl_ratio"][1].tolist() == pytest.approx([ratios[1]] * 2 + [0.0], rel=1e-6)
    assert m["mismatch_ppl_ratio"][2].tolist() == pytest.approx([ratios[2], 0.0, 0.0], rel=1e-6)
    # on-policy: no mismatch at all
    same = numerics.mismatch_metrics(behaviour, behaviour, MASK)
    assert not same["mismatch_kl"].any() and torch.equal(same["mismatch_ppl_ratio"], MASK.float())


def _inputs(requires_grad=False):
    proximal, behaviour = _logs()
    logp = proximal.clone().requires_grad_(requires_grad)  # on-policy w.r.t. old: PPO ratio 1
    adv = torch.tensor([[1.0] * 3, [-2.0] * 3, [0.5] * 3])
    return PolicyLossInputs(log_probs=logp, old_log_probs=proximal.clone(), advantages=adv, response_mask=MASK,
                            rollout_log_probs=behaviour), logp


def test_policy_loss_with_seq_tis_by_hand():
    inputs, logp = _inputs(requires_grad=True)
    out = get_algorithm("grpo")(AlgorithmConfig(off_policy_correction="seq_tis", off_policy_cap=2.0)).policy_loss(inputs)
    w = [math.exp(0.4), 2.0, math.exp(-1.5)]
    # ratio 1: per-token loss -A, times the sequence weight; token mean over 6 valid tokens
    per_token = [-1.0 * w[0]] * 3 + [2.0 * w[1]] * 2 + [-0.5 * w[2]]
    assert out.loss.item() == pytest.approx(sum(per_token) / 6, rel=1e-6)
    out.loss.backward()
    expected = torch.tensor([[-w[0] / 6] * 3, [2 * w[1] / 6] * 2 + [0.0], [-0.5 * w[2] / 6, 0.0, 0.0]])
    torch.testing.assert_close(logp.grad, expected, rtol=1e-6, atol=1e-7)
    assert out.metrics["off_policy_capped_frac"].item() == pytest.approx(2 / 6)
    k3 = [math.exp(d) - 1 - d for d in (0.2, 0.3, -0.1, 0.5, 0.6, -1.5)]
    assert out.metrics["off_policy_mismatch_kl"].item() == pytest.approx(sum(k3) / 6, rel=1e-5)


def test_policy_loss_with_seq_mask_tis_drops_the_rejected_sequences():
    inputs, _ = _inputs()
    out = get_algorithm("grpo")(AlgorithmConfig(off_policy_correction="seq_mask_tis", off_policy_cap=1.5)).policy_loss(
        inputs)
    kept = [-math.exp(0.2), -math.exp(0.3), -math.exp(-0.1)]  # sequence 0 only, token weights below the cap
    assert out.loss.item() == pytest.approx(sum(kept) / 6, rel=1e-6)
    assert out.metrics["off_policy_capped_frac"].item() == pytest.approx(3 / 6)  # the 3 tokens of rejected rows


def test_diagnostics_are_logged_whenever_behaviour_log_probs_arrive():
    inputs, _ = _inputs()
    out = get_algorithm("grpo")(AlgorithmConfig()).policy_loss(inputs)  # no correction: the loss is untouched
    plain = get_algorithm("grpo")(AlgorithmConfig()).policy_loss(
        PolicyLossInputs(log_probs=inputs.log_probs, old_log_probs=inputs.old_log_probs, advantages=inputs.advantages,
                         response_mask=MASK))
    assert out.loss.item() == plain.loss.item()
    ratios = [math.exp(-0.4 / 3)] * 3 + [math.exp(-1.1 / 2)] * 2 + [math.exp(1.5)]
    assert out.metrics["off_policy_mismatch_ppl_ratio"].item() == pytest.approx(sum(ratios) / 6, rel=1e-6)
    assert "off_policy_mismatch_kl" not in plain.metrics


def test_a_band_that_keeps_nothing_is_refused_before_the_run(tmp_path):
    from relax.config.run import RunConfig
    from relax.runtime.checks.validation import ConfigError, validate

    cfg = RunConfig(advantage_estimator="grpo",
                    algorithm=AlgorithmConfig(off_policy_correction="seq_mask_tis", off_policy_cap=1.0))
    with pytest.raises(ConfigError, match="seq_mask_tis"):
        validate(cfg, get_algorithm("grpo"))
