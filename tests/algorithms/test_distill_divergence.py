"""The GKD divergences (relax.algorithms.numerics.distill_divergence) against a float64 reference written
here from the definitions, bin by bin, on distributions that differ (never equal, some bins empty)."""

from __future__ import annotations

import math

import pytest
import torch

from relax.algorithms.numerics.distill_divergence import (
    generalized_jsd,
    reverse_kl,
    teacher_top_k,
    with_rest_bin,
)


def _kl(p: list[float], q: list[float]) -> float:
    """KL(p || q) in float64 from probabilities, 0 log 0 = 0."""
    return sum(pi * (math.log(pi) - math.log(qi)) for pi, qi in zip(p, q) if pi > 0)


def _reference_jsd(p_teacher: list[float], q_student: list[float], beta: float) -> float:
    if beta == 0.0:
        return _kl(p_teacher, q_student)
    if beta == 1.0:
        return _kl(q_student, p_teacher)
    m = [beta * p + (1 - beta) * q for p, q in zip(p_teacher, q_student)]
    return beta * _kl(p_teacher, m) + (1 - beta) * _kl(q_student, m)


def _distributions(seed: int, shape=(3, 5, 7)) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    student = torch.log_softmax(torch.randn(shape, generator=g, dtype=torch.float64) * 2.0, dim=-1)
    teacher = torch.log_softmax(torch.randn(shape, generator=g, dtype=torch.float64) * 3.0, dim=-1)
    return student, teacher


@pytest.mark.parametrize("beta", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_generalized_jsd_matches_the_float64_reference(beta):
    student, teacher = _distributions(0)
    got = generalized_jsd(student.float(), teacher.float(), beta)
    p, q = teacher.exp().tolist(), student.exp().tolist()
    for i in range(student.shape[0]):
        for t in range(student.shape[1]):
            want = _reference_jsd(p[i][t], q[i][t], beta)
            assert want > 1e-3  # the distributions differ: the formula matters
            assert got[i, t].item() == pytest.approx(want, rel=1e-5, abs=1e-6)


def test_the_ends_are_the_scaled_limits_forward_and_reverse_kl():
    student, teacher = _distributions(1)
    forward = generalized_jsd(student, teacher, 0.0)
    reverse = generalized_jsd(student, teacher, 1.0)
    eps = 1e-7  # the next term of the expansion is O(eps) relative
    torch.testing.assert_close(generalized_jsd(student, teacher, eps) / eps, forward, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(generalized_jsd(student, teacher, 1 - eps) / eps, reverse, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(reverse, reverse_kl(student, teacher))
    assert not torch.allclose(forward, reverse)  # the two directions really differ on these inputs


def test_empty_bins_contribute_nothing_and_keep_gradients_finite():
    # the teacher puts no mass on token 0 (truncated: the most negative float), the student none on token 3
    lowest = torch.finfo(torch.float32).min
    teacher = torch.log(torch.tensor([[0.0, 0.5, 0.3, 0.2]])).clamp(min=lowest)
    student_logits = torch.tensor([[0.4, -0.2, 1.0, lowest]], requires_grad=True)
    # (at beta 0 or 1 these are infinite: each side has a token the other gives no mass)
    for beta in (0.25, 0.5, 0.75):
        student = torch.log_softmax(student_logits, dim=-1)
        value = generalized_jsd(student, teacher, beta)
        (grad,) = torch.autograd.grad(value.sum(), student_logits)
        assert torch.isfinite(value).all() and torch.isfinite(grad).all()
        want = _reference_jsd(teacher.exp()[0].double().tolist(), student.exp()[0].double().tolist(), beta)
        assert value.item() == pytest.approx(want, rel=1e-5)


def test_gradient_matches_the_float64_reference_gradient():
    student_logits, teacher = _distributions(2, shape=(4, 6))
    logits32 = student_logits.float().requires_grad_(True)
    generalized_jsd(torch.log_softmax(logits32, -1), teacher.float(), 0.3).sum().backward()
    logits64 = student_logits.clone().requires_grad_(True)
    q = torch.softmax(logits64, -1)
    p = teacher.exp()
    m = 0.3 * p + 0.7 * q
    (0.3 * (p * (p.log() - m.log())).sum() + 0.7 * (q * (q.log() - m.log())).sum()).backward()
    torch.testing.assert_close(logits32.grad.double(), logits64.grad, rtol=1e-4, atol=1e-6)


def test_top_k_with_the_rest_bin_is_exact_at_the_whole_vocabulary_and_a_lower_bound_below():
    student, teacher = _distributions(3)
    full = generalized_jsd(student, teacher, 0.5)
    vocab = teacher.shape[-1]
    ids, top = teacher_top_k(teacher, 0)
    assert ids.shape == teacher.shape and torch.equal(top, teacher)
    torch.testing.assert_close(generalized_jsd(student.gather(-1, ids), top, 0.5), full)
    for k in (1, 3, vocab - 1):
        ids, top = teacher_top_k(teacher, k)
        assert ids.shape[-1] == k
        assert torch.equal(top, teacher.gather(-1, ids))
        assert (top[..., :-1] >= top[..., 1:]).all()  # the most likely first
        coarse = generalized_jsd(with_rest_bin(student.gather(-1, ids)), with_rest_bin(top), 0.5)
        # reference: the same two-part partition computed by hand in float64
        p, q = teacher.exp(), student.exp()
        in_top = torch.zeros_like(p, dtype=torch.bool).scatter(-1, ids, True)
        p_rest, q_rest = (p * ~in_top).sum(-1), (q * ~in_top).sum(-1)
        for i, t in [(0, 0), (1, 2), (2, 4)]:
            pb = p[i, t][ids[i, t]].tolist() + [p_rest[i, t].item()]
            qb = q[i, t][ids[i, t]].tolist() + [q_rest[i, t].item()]
            assert coarse[i, t].item() == pytest.approx(_reference_jsd(pb, qb, 0.5), rel=1e-9)
        assert (coarse <= full + 1e-12).all()  # merging bins never raises a divergence


def test_rest_bin_of_a_whole_distribution_is_empty_and_finite():
    _, teacher = _distributions(4)
    logits = teacher.float().clone().requires_grad_(True)
    extended = with_rest_bin(torch.log_softmax(logits, -1))
    assert torch.isfinite(extended).all()
    assert extended[..., -1].exp().max().item() < 1e-6
    generalized_jsd(extended, with_rest_bin(teacher.float()), 0.5).sum().backward()
    assert torch.isfinite(logits.grad).all()


def test_bad_beta_and_mismatched_bins_are_refused():
    student, teacher = _distributions(5)
    with pytest.raises(ValueError, match="beta must lie in"):
        generalized_jsd(student, teacher, 1.5)
    with pytest.raises(ValueError, match="same bins"):
        generalized_jsd(student[..., :3], teacher, 0.5)
