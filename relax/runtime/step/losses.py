"""The loss a training backend runs for one optimizer mini-batch, shared by the actor ranks and the
single-process loop so that the step is defined once."""

from __future__ import annotations

import torch

from relax.algorithms import PolicyLossInputs, PolicyLossOutput
from relax.algorithms.types import check_policy_loss_output
from relax.backends.base import LossFn


def policy_loss_fn(
    algorithm,
    *,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    ref_log_probs: torch.Tensor | None = None,
    teacher_log_probs: torch.Tensor | None = None,
    rollout_log_probs: torch.Tensor | None = None,
    global_num_tokens: float,
    global_num_sequences: float,
    max_response_length: int | None = None,
    step: int | None = None,
    teacher_top_ids: torch.Tensor | None = None,
    teacher_top_log_probs: torch.Tensor | None = None,
) -> LossFn:
    """``loss_fn(token_log_probs, micro)`` for ``TrainingBackend.train_step``: ``algorithm.policy_loss``
    on the micro-batch rows ``micro`` (a slice, or the row indices of a token-budget micro-batch) of
    this mini-batch's tensors, normalized by the mini-batch's
    global token and sequence counts, so the backend's sum over micro-batches (and the gradient
    all-reduce over data-parallel ranks) gives exactly the whole mini-batch's loss.
    ``max_response_length``: the run's generation limit (``--rollout-max-response-len``), the L_max of
    ``--loss-aggregation seq_mean_token_sum_norm``. ``teacher_top_ids`` / ``teacher_top_log_probs``
    (``[N, T, k]``, a method with ``teacher_top_k()``, GKD): the teacher's top-k tokens; the student's
    log-probs of the same tokens are read from the backend's whole distribution (``train_step(...,
    with_distribution=True)``), with their gradient.

    The output is checked (``check_policy_loss_output``): a non-scalar, non-float or non-finite loss
    stops the run naming the class, the method and ``step`` (when given), before any weight moves."""

    inputs = {"old_log_probs": old_log_probs, "advantages": advantages, "response_mask": response_mask,
              "ref_log_probs": ref_log_probs, "rollout_log_probs": rollout_log_probs,
              "teacher_log_probs": teacher_log_probs,
              "teacher_top_ids": teacher_top_ids, "teacher_top_log_probs": teacher_top_log_probs}

    def on(device: torch.device) -> dict:
        # The mini-batch's tensors meet the backend's log-probs on their device: moved once (a no-op
        # when the caller put them there), so that a micro-batch's rows index tensors on one device.
        if any(t is not None and t.device != device for t in inputs.values()):
            inputs.update({k: t.to(device, non_blocking=True) if t is not None else None for k, t in inputs.items()})
        return inputs

    def loss_fn(tlp, micro: slice | torch.Tensor) -> PolicyLossOutput:
        x = on(tlp.log_probs.device)
        old_log_probs, advantages, response_mask = x["old_log_probs"], x["advantages"], x["response_mask"]
        ref_log_probs, rollout_log_probs, teacher = x["ref_log_probs"], x["rollout_log_probs"], x["teacher_log_probs"]
        teacher_top, student_top = _top_log_probs(tlp, x["teacher_top_ids"], x["teacher_top_log_probs"], micro)
        output = algorithm.policy_loss(
            PolicyLossInputs(
                log_probs=tlp.log_probs,
                old_log_probs=old_log_probs[micro],
                advantages=advantages[micro],
                response_mask=response_mask[micro],
                ref_log_probs=ref_log_probs[micro] if ref_log_probs is not None else None,
                rollout_log_probs=rollout_log_probs[micro] if rollout_log_probs is not None else None,
                teacher_log_probs=teacher[micro] if teacher is not None else None,
                entropy=tlp.entropy,
                global_num_tokens=float(global_num_tokens),
                global_num_sequences=float(global_num_sequences),
                max_response_length=max_response_length,
                teacher_top_log_probs=teacher_top,
                student_top_log_probs=student_top,
            )
        )
        check_policy_loss_output(algorithm, output, step=step)
        return output

    return loss_fn


def _top_log_probs(tlp, ids, teacher_log_probs, micro):
    """``(teacher, student)`` log-probs ``[n, T, k]`` of the teacher's top-k tokens on the micro-batch's
    rows, or ``(None, None)`` when the method reads no distribution."""
    if ids is None:
        return None, None
    if tlp.all_log_probs is None:
        raise ValueError(
            "the method reads the student's distribution over the vocabulary (teacher_top_k), but the backend "
            "handed the loss only the sampled tokens' log-probs; train it with a backend that gives_distributions"
        )
    return teacher_log_probs[micro], tlp.all_log_probs.gather(-1, ids[micro])


def zero_loss(tlp, micro: slice | torch.Tensor) -> PolicyLossOutput:
    """For a rank that holds nothing of a mini-batch: zero loss and gradient, but it still joins the
    gradient all-reduce."""
    return PolicyLossOutput(loss=tlp.log_probs.sum() * 0.0, metrics={})
