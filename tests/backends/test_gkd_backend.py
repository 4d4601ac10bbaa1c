"""GKD through the torch backend: the student's whole distribution reaches the loss (padded and packed
micro-batches agree), the teacher's top-k is gathered on the micro-batch's rows, and steps distill."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from relax.algorithms.gkd import GKD
from relax.algorithms.numerics.distill_divergence import generalized_jsd, teacher_top_k
from relax.backends.torch_backend import TorchBackend
from relax.models.batch import response_log_probs
from relax.runtime.step.losses import policy_loss_fn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the packing tests' helpers, by file name
from test_packing import BUDGET, R_WIDTH, make_batch, max_rel_diff, tiny_model  # noqa: E402


def _teacher_distribution(batch, seed=7):
    with torch.no_grad():
        teacher = tiny_model(seed)
        logits = teacher(input_ids=batch.input_ids, attention_mask=batch.attention_mask.long(),
                         position_ids=batch.position_ids)
        return response_log_probs(logits, batch, with_entropy=False, with_distribution=True).all_log_probs


def _gkd_loss_fn(batch, top_k, beta=0.5):
    ids, top = teacher_top_k(_teacher_distribution(batch), top_k)
    mask = batch.response_mask
    algorithm = GKD(GKD.Config(gkd_beta=beta, gkd_top_k=top_k))
    zeros = torch.zeros(mask.shape)
    return policy_loss_fn(algorithm, old_log_probs=zeros, advantages=zeros, response_mask=mask,
                          global_num_tokens=float(mask.sum()), global_num_sequences=float((mask.sum(1) > 0).sum()),
                          max_response_length=R_WIDTH, teacher_top_ids=ids, teacher_top_log_probs=top)


def _step(batch, loss_fn, **backend_kw):
    model = tiny_model()
    micro = backend_kw.pop("micro_batch_size", None)
    metrics = TorchBackend(model, lr=0.0, clip_grad=None, **backend_kw).train_step(
        batch, loss_fn, micro_batch_size=micro, with_entropy=False, with_distribution=True)
    return {n: p.grad.clone() for n, p in model.named_parameters()}, metrics


def test_whole_distribution_is_the_same_padded_and_packed():
    batch = make_batch()
    model = tiny_model()
    backend = TorchBackend(model, max_tokens_per_micro_batch=BUDGET)
    plan_rows = []
    for rows, out in backend._micro_batches(batch, None, with_entropy=False, with_distribution=True):
        padded = TorchBackend(model)._forward(batch.select(rows), with_entropy=False, with_distribution=True)
        torch.testing.assert_close(out.all_log_probs, padded.all_log_probs, rtol=0, atol=2e-5)
        # the sampled token's log-prob is read from that distribution
        torch.testing.assert_close(out.all_log_probs.gather(-1, batch.response_ids[rows, :, None]).squeeze(-1),
                                   out.log_probs)
        plan_rows.append(rows)
    assert len(plan_rows) > 1  # several packed micro-batches


@pytest.mark.parametrize("top_k", [0, 3])
def test_gkd_step_is_the_same_packed_padded_and_in_micro_batches(top_k):
    batch = make_batch()
    whole = _step(batch, _gkd_loss_fn(batch, top_k))
    for kw in ({"max_tokens_per_micro_batch": BUDGET}, {"micro_batch_size": 5}):
        grads, metrics = _step(batch, _gkd_loss_fn(batch, top_k), **kw)
        assert max_rel_diff(grads, whole[0]) < 1e-5, kw
        for name in ("loss", "gkd_loss", "gkd_reverse_kl"):
            assert metrics[name] == pytest.approx(whole[1][name], rel=1e-5), (kw, name)
    assert whole[1]["gkd_loss"] > 1e-3 and whole[1]["grad_norm"] > 0


def test_a_backend_step_without_the_distribution_is_refused_clearly():
    batch = make_batch()
    backend = TorchBackend(tiny_model())
    with pytest.raises(ValueError, match="gives_distributions"):
        backend.train_step(batch, _gkd_loss_fn(batch, 0), with_entropy=False)


def test_gkd_steps_bring_the_student_to_the_teacher():
    batch = make_batch(multi_turn=False)
    teacher = _teacher_distribution(batch)
    model = tiny_model()
    backend = TorchBackend(model, lr=3e-3, clip_grad=1.0)
    mask = batch.response_mask

    def divergence():
        with torch.no_grad():
            student = backend._forward(batch, with_entropy=False, with_distribution=True).all_log_probs
            return float((generalized_jsd(student, teacher, 0.5) * mask).sum() / mask.sum())

    before = divergence()
    for _ in range(40):
        backend.train_step(batch, _gkd_loss_fn(batch, 0), with_entropy=False, with_distribution=True)
    after = divergence()
    assert after < 0.5 * before, (before, after)


@pytest.mark.parametrize("top_k", [0, 4])
def test_frozen_top_k_is_the_same_in_every_micro_batch_layout(top_k):
    from relax.config.run import RunConfig
    from relax.runtime.step.reference_pass import frozen_top_k, reference_log_probs

    batch = make_batch()
    teacher = tiny_model(7)
    want_ids, want = teacher_top_k(_teacher_distribution(batch), top_k)
    mask = batch.response_mask
    for kw in ({}, {"micro_batch_size": 5}, {"max_tokens_per_micro_batch": BUDGET}):
        log_probs, ids, top = frozen_top_k(teacher, batch, RunConfig(**kw), top_k)
        # the per-token log-probs of the same pass are the teacher's log-probs of the sampled tokens, bit for bit
        assert torch.equal(log_probs, reference_log_probs(teacher, batch, RunConfig(**kw)))
        assert ids.shape == want_ids.shape == (len(batch), R_WIDTH, top_k or 17)
        torch.testing.assert_close(top[mask], want[mask], rtol=0, atol=2e-5)
        # the same tokens (ties aside: compare their log-probs under the teacher)
        full = _teacher_distribution(batch)
        torch.testing.assert_close(full.gather(-1, ids)[mask], want[mask], rtol=0, atol=2e-5)
