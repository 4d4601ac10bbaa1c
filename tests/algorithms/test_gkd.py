"""GKD's loss (relax.algorithms.gkd) against a float64 reference written here, and its refusals."""

from __future__ import annotations

import math

import pytest
import torch

from relax.algorithms import PolicyLossInputs, get_algorithm
from relax.algorithms.gkd import GKD
from relax.algorithms.numerics.distill_divergence import teacher_top_k

N, T, V = 3, 4, 6


def _inputs(top_k: int, seed: int = 0, requires_grad: bool = False):
    g = torch.Generator().manual_seed(seed)
    student_logits = (torch.randn(N, T, V, generator=g, dtype=torch.float64) * 2).requires_grad_(requires_grad)
    teacher = torch.log_softmax(torch.randn(N, T, V, generator=g, dtype=torch.float64) * 3, -1)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [0, 1, 1, 1]], dtype=torch.bool)
    student = torch.log_softmax(student_logits, -1)
    ids, teacher_top = teacher_top_k(teacher, top_k)
    zeros = torch.zeros(N, T)
    inputs = PolicyLossInputs(
        log_probs=zeros, old_log_probs=zeros, advantages=zeros, response_mask=mask,
        teacher_top_log_probs=teacher_top.float(), student_top_log_probs=student.gather(-1, ids).float(),
        global_num_tokens=float(mask.sum() + 3),  # the mini-batch holds tokens of other micro-batches too
    )
    return inputs, student_logits, teacher, ids, mask


def _reference_loss(student_logits, teacher, ids, mask, beta, top_k, divisor):
    """sum over valid tokens of JSD_beta over the bins {teacher's top-k, rest} (or all tokens), / divisor."""
    q_all, p_all = torch.softmax(student_logits.detach(), -1), teacher.exp()
    total = 0.0
    for i in range(N):
        for t in range(T):
            if not mask[i, t]:
                continue
            chosen = ids[i, t].tolist()
            p = [p_all[i, t, v].item() for v in chosen]
            q = [q_all[i, t, v].item() for v in chosen]
            if top_k:
                p.append(1 - sum(p))
                q.append(1 - sum(q))
            m = [beta * a + (1 - beta) * b for a, b in zip(p, q)]
            kl_pm = sum(a * math.log(a / c) for a, c in zip(p, m) if a > 0)
            kl_qm = sum(b * math.log(b / c) for b, c in zip(q, m) if b > 0)
            total += beta * kl_pm + (1 - beta) * kl_qm
    return total / divisor


@pytest.mark.parametrize("top_k", [0, 2])
@pytest.mark.parametrize("beta", [0.2, 0.5, 0.9])
def test_loss_is_the_token_mean_of_the_generalized_jsd(beta, top_k):
    inputs, student_logits, teacher, ids, mask = _inputs(top_k)
    out = GKD(GKD.Config(gkd_beta=beta, gkd_top_k=top_k)).policy_loss(inputs)
    want = _reference_loss(student_logits, teacher, ids, mask, beta, top_k, inputs.global_num_tokens)
    assert want > 1e-2  # distributions that differ
    assert out.loss.item() == pytest.approx(want, rel=2e-5)
    assert out.metrics["gkd_loss"].item() == pytest.approx(want, rel=2e-5)


def test_the_ends_are_forward_and_reverse_kl_and_the_reverse_kl_metric():
    inputs, student_logits, teacher, _, mask = _inputs(0, seed=1)
    q, p = torch.softmax(student_logits, -1), teacher.exp()
    per_token_forward = (p * (p.log() - q.log())).sum(-1)
    per_token_reverse = (q * (q.log() - p.log())).sum(-1)
    divisor = inputs.global_num_tokens
    forward = GKD(GKD.Config(gkd_beta=0.0)).policy_loss(inputs)
    reverse = GKD(GKD.Config(gkd_beta=1.0)).policy_loss(inputs)
    assert forward.loss.item() == pytest.approx((per_token_forward * mask).sum().item() / divisor, rel=2e-5)
    assert reverse.loss.item() == pytest.approx((per_token_reverse * mask).sum().item() / divisor, rel=2e-5)
    # the reverse-KL metric does not depend on beta
    assert forward.metrics["gkd_reverse_kl"].item() == pytest.approx(reverse.loss.item(), rel=2e-5)


def test_gradient_reaches_the_student_only_on_valid_tokens():
    _, student_logits, teacher, _, mask = _inputs(0, seed=2, requires_grad=True)
    student = torch.log_softmax(student_logits.float(), -1)
    zeros = torch.zeros(N, T)
    inputs = PolicyLossInputs(log_probs=zeros, old_log_probs=zeros, advantages=zeros, response_mask=mask,
                              teacher_top_log_probs=teacher.float(), student_top_log_probs=student)
    GKD(GKD.Config(gkd_beta=0.5)).policy_loss(inputs).loss.backward()
    grad = student_logits.grad
    assert torch.isfinite(grad).all()
    assert (grad[~mask] == 0).all() and (grad[mask].abs().sum(-1) > 0).all()


def test_registered_with_a_teacher_and_its_flags():
    cls = get_algorithm("gkd")
    assert cls is GKD and cls.needs_teacher
    assert {"gkd_beta", "gkd_top_k"} <= set(cls.hyperparameters)
    assert GKD(GKD.Config(gkd_top_k=5)).teacher_top_k() == 5
    with pytest.raises((ValueError, TypeError)):
        GKD.Config(gkd_beta=1.5)


def test_without_the_teacher_distribution_the_loss_says_what_is_missing():
    zeros = torch.zeros(N, T)
    inputs = PolicyLossInputs(log_probs=zeros, old_log_probs=zeros, advantages=zeros,
                              response_mask=torch.ones(N, T, dtype=torch.bool))
    with pytest.raises(ValueError, match="teacher_top_log_probs is None"):
        GKD().policy_loss(inputs)
    with pytest.raises(ValueError, match="both or neither"):
        PolicyLossInputs(log_probs=zeros, old_log_probs=zeros, advantages=zeros,
                         response_mask=torch.ones(N, T, dtype=torch.bool), teacher_top_log_probs=torch.zeros(N, T, 2))


def test_gkd_is_refused_before_ray_where_the_loss_cannot_see_distributions(monkeypatch):
    import relax.backends.megatron.rules as megatron_rules
    from relax.config.run import RunConfig
    from relax.runtime.checks import validation

    monkeypatch.setattr(megatron_rules, "megatron_installed", lambda: True)
    base = {"advantage_estimator": "gkd", "algorithm": GKD.Config(gkd_top_k=4)}
    with pytest.raises(validation.ConfigError, match="--backend megatron does not hand the loss"):
        validation.validate(RunConfig(**base, backend="megatron"), GKD)
    with pytest.raises(validation.ConfigError, match="drop --sharding fsdp"):
        validation.validate(RunConfig(**base, sharding="fsdp", actor_num_workers=2), GKD)
