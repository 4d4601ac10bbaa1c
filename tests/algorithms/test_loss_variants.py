"""The ``seq_mean_token_sum_norm`` aggregation (Dr. GRPO's B * L_max divisor) and the ``k3+`` KL
estimator (k3's value, k2's gradient), checked against hand-computed values and gradients."""

import math

import pytest
import torch

from relax.algorithms import AlgorithmConfig, PolicyLossInputs, get_algorithm, numerics

MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
# valid values 1, 2, 3 | 4, 5; the padded positions hold garbage that must never count
PER_TOKEN = [[1.0, 2.0, 3.0, float("nan")], [4.0, 5.0, 1e30, -7.0]]


# -- seq_mean_token_sum_norm --


def test_value_is_the_token_sum_over_sequences_times_the_generation_limit():
    x = torch.tensor(PER_TOKEN)
    # (1 + 2 + 3 + 4 + 5) / (B = 2 sequences x L_max = 6), whatever the batch's own widest response (3)
    got = numerics.aggregate(x, MASK, "seq_mean_token_sum_norm", max_response_length=6)
    assert got.item() == pytest.approx(15 / 12)
    # = seq_mean_token_sum / L_max: the same direction, a constant scale
    per_seq_sum = numerics.aggregate(x, MASK, "seq_mean_token_sum")
    assert per_seq_sum.item() == pytest.approx(7.5)
    assert got.item() == pytest.approx(per_seq_sum.item() / 6)


def test_gradient_is_one_over_b_times_l_max_on_every_valid_token():
    x = torch.tensor([[1.0, 2.0, 3.0, 0.0], [4.0, 5.0, 0.0, 0.0]], requires_grad=True)
    numerics.aggregate(x, MASK, "seq_mean_token_sum_norm", max_response_length=6).backward()
    expected = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]]) / 12
    torch.testing.assert_close(x.grad, expected, rtol=0, atol=0)
    # unlike seq_mean_token_mean, a token of the short response weighs what a token of the long one does
    y = x.detach().clone().requires_grad_(True)
    numerics.aggregate(y, MASK, "seq_mean_token_mean").backward()
    assert y.grad[0, 0].item() == pytest.approx(1 / 6) and y.grad[1, 0].item() == pytest.approx(1 / 4)


def test_micro_batches_add_up_to_the_mini_batch_with_the_global_sequence_count():
    x = torch.tensor(PER_TOKEN)
    whole = numerics.aggregate(x, MASK, "seq_mean_token_sum_norm", max_response_length=5)
    parts = [numerics.aggregate(x[i:i + 1], MASK[i:i + 1], "seq_mean_token_sum_norm", global_num_sequences=2.0,
                                max_response_length=5) for i in range(2)]
    assert whole.item() == pytest.approx(15 / 10)
    assert sum(p.item() for p in parts) == pytest.approx(whole.item())


def test_without_the_generation_limit_it_says_which_flag_sets_it():
    with pytest.raises(ValueError, match="--rollout-max-response-len"):
        numerics.aggregate(torch.tensor(PER_TOKEN), MASK, "seq_mean_token_sum_norm")


def test_existing_modes_are_untouched_by_the_new_argument():
    x = torch.tensor(PER_TOKEN)
    for mode in ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum"):
        assert torch.equal(numerics.aggregate(x, MASK, mode),
                           numerics.aggregate(x, MASK, mode, max_response_length=6))


def test_grpo_policy_loss_with_the_norm_aggregation_by_hand():
    # on-policy (ratio 1): the PPO surrogate's gradient is -A per token; divisor B * L_max = 2 * 8
    logp = torch.tensor([[-1.0, -2.0, -0.5, 0.0], [-0.3, -1.2, 0.0, 0.0]], requires_grad=True)
    adv = torch.tensor([[1.5] * 4, [-0.5] * 4])
    inputs = PolicyLossInputs(log_probs=logp, old_log_probs=logp.detach().clone(), advantages=adv,
                              response_mask=MASK, global_num_tokens=5.0, global_num_sequences=2.0,
                              max_response_length=8)
    algo = get_algorithm("grpo")(AlgorithmConfig(loss_aggregation="seq_mean_token_sum_norm"))
    out = algo.policy_loss(inputs)
    assert out.loss.item() == pytest.approx((-1.5 * 3 + 0.5 * 2) / 16)
    out.loss.backward()
    expected = torch.tensor([[-1.5, -1.5, -1.5, 0.0], [0.5, 0.5, 0.0, 0.0]]) / 16
    torch.testing.assert_close(logp.grad, expected, rtol=0, atol=1e-7)


def test_the_flag_accepts_the_new_choices():
    assert AlgorithmConfig(loss_aggregation="seq_mean_token_sum_norm").loss_aggregation == "seq_mean_token_sum_norm"
    assert AlgorithmConfig(kl_loss_type="k3+").kl_loss_type == "k3+"


# -- k3+ --

D = [0.5, -1.0, 2.0, -0.25]  # logp - logp_ref


def _k3(d):
    return math.exp(-d) - 1 + d


def test_k3_plus_has_k3s_value_exactly():
    logp = torch.tensor([[-1.0, -2.0, -0.5, -3.0]])
    ref = logp - torch.tensor([D])
    plus = numerics.kl_estimate(logp, ref, "k3+")
    assert torch.equal(plus, numerics.kl_estimate(logp, ref, "k3"))
    assert plus[0].tolist() == pytest.approx([_k3(d) for d in D], rel=1e-6)


def test_k3_plus_has_k2s_gradient():
    logp = torch.tensor([[-1.0, -2.0, -0.5, -3.0]], requires_grad=True)
    ref = logp.detach() - torch.tensor([D])
    numerics.kl_estimate(logp, ref, "k3+").sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([D]), rtol=0, atol=1e-6)  # d(d^2/2)/dlogp = d
    k3_grad = torch.tensor([[1 - math.exp(-d) for d in D]])  # what plain k3 would give
    assert not torch.allclose(logp.grad, k3_grad, atol=1e-2)
    logp.grad = None
    numerics.kl_estimate(logp, ref, "k3").sum().backward()
    torch.testing.assert_close(logp.grad, k3_grad, rtol=0, atol=1e-6)


def test_kl_loss_term_with_k3_plus_through_policy_loss():
    logp = torch.tensor([[-1.0, -2.0, -0.5, -3.0], [-0.2, -0.7, -0.1, -0.4]], requires_grad=True)
    ref = logp.detach() - torch.tensor([D, D])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)
    zero_adv = torch.zeros(2, 4)  # only the KL term moves the loss
    inputs = PolicyLossInputs(log_probs=logp, old_log_probs=logp.detach().clone(), advantages=zero_adv,
                              response_mask=mask, ref_log_probs=ref)
    algo = get_algorithm("grpo")(AlgorithmConfig(use_kl_loss=True, kl_loss_coef=0.5, kl_loss_type="k3+"))
    out = algo.policy_loss(inputs)
    valid = D + D[:2]
    assert out.metrics["kl_loss"].item() == pytest.approx(sum(_k3(d) for d in valid) / 6, rel=1e-6)
    out.loss.backward()
    # token mean over 6 tokens, coefficient 0.5: d/dlogp = 0.5 * d / 6
    expected = torch.tensor([[0.5 * d / 6 for d in D], [0.5 * D[0] / 6, 0.5 * D[1] / 6, 0.0, 0.0]])
    torch.testing.assert_close(logp.grad, expected, rtol=0, atol=1e-6)
