"""On-policy distillation (``relax.algorithms.distill``): the per-token advantage
c * (log pi_teacher - log pi_old) + (1 - c) * A^reward against a float64 reference written out here,
the loss it feeds, and the capabilities that give the method its teacher role."""

from __future__ import annotations

import attrs
import pytest
import torch

from relax.algorithms import PolicyLossInputs, RLAlgorithm, get_algorithm
from relax.algorithms.distill import OnPolicyDistill
from relax.algorithms.grpo import GRPO

N, T = 5, 7
EPS = 0.2


def _inputs(seed: int = 3) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([7, 4, 1, 6, 3])
    mask = torch.arange(T)[None, :] < lengths[:, None]
    mask[0, 2:4] = False  # an environment turn inside an episode: never scored
    old = -torch.rand((N, T), generator=g, dtype=torch.float64) * 3
    return {
        "mask": mask,
        "old": old,
        "new": old + torch.randn((N, T), generator=g, dtype=torch.float64) * 0.3,  # ratios inside and outside the clip
        "teacher": old + torch.randn((N, T), generator=g, dtype=torch.float64),
        # a reward advantage of one value per sample (GRPO's), broadcast over its tokens
        "reward_adv": (torch.randn((N,), generator=g, dtype=torch.float64)[:, None] * mask),
    }


def _reference_loss(x, coef: float) -> float:
    """The token-mean PPO clipped surrogate with the mixed advantage, in float64, token by token."""
    total, count = 0.0, 0
    for i in range(N):
        for t in range(T):
            if not x["mask"][i, t]:
                continue
            advantage = coef * float(x["teacher"][i, t] - x["old"][i, t]) + (1 - coef) * float(x["reward_adv"][i, t])
            ratio = float(torch.exp(x["new"][i, t] - x["old"][i, t]).detach())
            clipped = min(max(ratio, 1 - EPS), 1 + EPS)
            total += -min(ratio * advantage, clipped * advantage)
            count += 1
    return total / count


def _loss(algo, x, dtype=torch.float64, **changes):
    m = x["mask"]
    inputs = PolicyLossInputs(
        log_probs=x["new"].to(dtype).requires_grad_(True), old_log_probs=x["old"].to(dtype),
        advantages=x["reward_adv"].to(dtype), response_mask=m, teacher_log_probs=x["teacher"].to(dtype),
        global_num_tokens=float(m.sum()), global_num_sequences=float(N))
    return algo.policy_loss(attrs.evolve(inputs, **changes)), inputs


@pytest.mark.parametrize("coef", [1.0, 0.3, 0.0])
def test_loss_matches_the_float64_reference(coef):
    x = _inputs()
    algo = OnPolicyDistill(OnPolicyDistill.Config(distill_coef=coef, eps_clip=EPS))
    out, _ = _loss(algo, x)
    assert float(out.loss.detach()) == pytest.approx(_reference_loss(x, coef), rel=1e-12, abs=1e-14)
    out32, _ = _loss(algo, x, dtype=torch.float32)  # what the trainer runs
    assert float(out32.loss.detach()) == pytest.approx(_reference_loss(x, coef), rel=1e-5, abs=1e-6)


def test_advantage_is_the_teacher_student_log_ratio_per_token_without_discount():
    x = _inputs()
    algo = OnPolicyDistill(OnPolicyDistill.Config(distill_coef=0.3))
    _, inputs = _loss(algo, x)
    got = algo.distill_advantages(inputs)
    expected = torch.where(x["mask"], 0.3 * (x["teacher"] - x["old"]) + 0.7 * x["reward_adv"], 0.0)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-15)
    # each token only its own log-ratio: changing a later token's teacher value leaves earlier ones alone
    later = x["teacher"].clone()
    later[:, 4:] -= 5.0
    again = algo.distill_advantages(attrs.evolve(inputs, teacher_log_probs=later))
    torch.testing.assert_close(again[:, :4], got[:, :4], rtol=0, atol=0)


def test_on_policy_gradient_pushes_each_token_by_its_advantage():
    """At ratio 1 the surrogate's gradient w.r.t. a token's log-prob is -A_t / (valid tokens)."""
    x = _inputs()
    x["new"] = x["old"].clone()
    algo = OnPolicyDistill(OnPolicyDistill.Config())
    out, inputs = _loss(algo, x)
    out.loss.backward()
    expected = -torch.where(x["mask"], x["teacher"] - x["old"], 0.0) / x["mask"].sum()
    torch.testing.assert_close(inputs.log_probs.grad, expected, rtol=1e-12, atol=1e-15)


def test_unscored_tokens_and_their_teacher_values_change_nothing():
    x = _inputs()
    algo = OnPolicyDistill(OnPolicyDistill.Config(distill_coef=0.6))
    out, _ = _loss(algo, x)
    noisy = torch.where(x["mask"], x["teacher"], torch.full_like(x["teacher"], -1e4))  # environment tokens
    again, _ = _loss(algo, x, teacher_log_probs=noisy)
    assert float(again.loss.detach()) == float(out.loss.detach())


def test_coefficient_zero_is_grpo_exactly():
    x = _inputs()
    distill, _ = _loss(OnPolicyDistill(OnPolicyDistill.Config(distill_coef=0.0)), x)
    grpo, _ = _loss(GRPO(GRPO.Config()), x)
    assert float(distill.loss.detach()) == float(grpo.loss.detach())


def test_missing_teacher_log_probs_is_a_clear_error():
    x = _inputs()
    with pytest.raises(ValueError, match="teacher_log_probs.*--teacher-checkpoint"):
        _loss(OnPolicyDistill(OnPolicyDistill.Config()), x, teacher_log_probs=None)


def test_the_coefficient_is_a_checked_flag():
    with pytest.raises(ValueError, match="distill"):
        OnPolicyDistill.Config(distill_coef=1.5)


def test_capabilities():
    cls = get_algorithm("on-policy-distill")
    assert cls is OnPolicyDistill
    assert cls.needs_teacher and not cls.group_relative and cls.supports_async and cls.min_group_size == 1
    assert "distill_coef" in cls.hyperparameters
    # every sample carries the teacher's signal: a group of equal rewards is kept
    keep = cls(cls.Config(reward_keys=("r",))).group_has_signal(torch.ones(4), torch.tensor([0, 0, 1, 1]))
    assert keep.all()


def test_needs_teacher_is_validated_when_the_class_is_defined():
    with pytest.raises(TypeError, match="needs_teacher must be of type bool"):
        class Bad(GRPO):
            needs_teacher = "yes"
    with pytest.raises(TypeError, match="needs_teachers is not a known capability.*needs_teacher"):
        class Typo(GRPO):
            needs_teachers = True
    assert RLAlgorithm.needs_teacher is False
