"""Typed inputs and outputs of the three algorithm stages (docs/design.md §2).

Shapes: N samples, T response tokens. Every ``[N, T]`` tensor is right-padded and comes with a
boolean ``response_mask``; positions where the mask is false never contribute to anything.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping

import attrs
import torch


def _optional_tensor(instance, attribute, value):
    if value is not None and not isinstance(value, torch.Tensor):
        raise TypeError(f"{attribute.name} must be a torch.Tensor or None, got {type(value).__name__}")


def _tensor(instance, attribute, value):
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{attribute.name} must be a torch.Tensor, got {type(value).__name__}")


def _segment_sizes(instance, attribute, value):
    if value is None:
        return
    if not value or any(not isinstance(s, int) or isinstance(s, bool) or s < 0 for s in value):
        raise ValueError(f"segment_sizes must be a non-empty tuple of non-negative ints, got {value!r}")


@attrs.frozen(kw_only=True)
class AdvantageInputs:
    """What ``compute_advantages`` receives for one batch (one whole rollout or one shard of it).

    ``rewards`` is the per-sample output of ``normalize_rewards``. ``segment_sizes`` gives the sample
    counts of the optimizer mini-batches in order (on this rank); ``None`` means the inputs form
    exactly one mini-batch. Algorithms that use it check that it sums to N on every rank together.
    """

    rewards: torch.Tensor = attrs.field(validator=_tensor)
    response_mask: torch.Tensor = attrs.field(validator=_tensor)
    values: torch.Tensor | None = attrs.field(default=None, validator=_optional_tensor)
    kl: torch.Tensor | None = attrs.field(default=None, validator=_optional_tensor)
    segment_sizes: tuple[int, ...] | None = attrs.field(
        default=None, converter=attrs.converters.optional(tuple), validator=_segment_sizes
    )

    def __attrs_post_init__(self):
        n = self.rewards.shape[0]
        if self.rewards.dim() != 1:
            raise ValueError(f"rewards must be 1-D [N], got shape {tuple(self.rewards.shape)}")
        if self.response_mask.dim() != 2 or self.response_mask.shape[0] != n:
            raise ValueError(
                f"response_mask must be [N, T] with N={n}, got shape {tuple(self.response_mask.shape)}"
            )
        for name in ("values", "kl"):
            t = getattr(self, name)
            if t is not None and t.shape != self.response_mask.shape:
                raise ValueError(
                    f"{name} must have the shape of response_mask {tuple(self.response_mask.shape)}, "
                    f"got {tuple(t.shape)}"
                )
        # ``sum(segment_sizes) == N`` is deliberately NOT checked here: with a process group, a
        # rank that raised before the first collective would leave the other ranks hanging. The
        # algorithms that use segments check it inside a collective and raise on every rank.


@attrs.frozen(kw_only=True)
class PolicyLossInputs:
    """What ``policy_loss`` receives for one (micro-)batch on one training rank.

    ``global_num_tokens`` / ``global_num_sequences``: the number of valid response tokens / sequences
    of the whole optimizer mini-batch across all micro-batches and data-parallel ranks. When given,
    the loss is divided by them instead of by the local counts, so that summing the micro-batch
    losses (and averaging gradients over ranks times the world size) reproduces the full-batch loss.
    ``teacher_log_probs``: the frozen teacher's log-probs of the sampled tokens (zero outside the
    response), given only to a method that declares ``needs_teacher``.
    ``max_response_length``: the generation limit L_max (``--rollout-max-response-len``), the constant
    of the ``seq_mean_token_sum_norm`` aggregation's divisor.
    """

    log_probs: torch.Tensor = attrs.field(validator=_tensor)
    old_log_probs: torch.Tensor = attrs.field(validator=_tensor)
    advantages: torch.Tensor = attrs.field(validator=_tensor)
    response_mask: torch.Tensor = attrs.field(validator=_tensor)
    ref_log_probs: torch.Tensor | None = attrs.field(default=None, validator=_optional_tensor)
    entropy: torch.Tensor | None = attrs.field(default=None, validator=_optional_tensor)
    rollout_log_probs: torch.Tensor | None = attrs.field(default=None, validator=_optional_tensor)
    teacher_log_probs: torch.Tensor | None = attrs.field(default=None, validator=_optional_tensor)
    global_num_tokens: float | None = None
    global_num_sequences: float | None = None
    max_response_length: int | None = None
    # A method whose ``teacher_top_k()`` is not None (GKD): at every position, the log-probs of the
    # teacher's top-k tokens ``[N, T, k]`` (k = V: the whole vocabulary) under the teacher (no gradient)
    # and under the student (with gradient), the same tokens in the same order.
    teacher_top_log_probs: torch.Tensor | None = attrs.field(default=None, validator=_optional_tensor)
    student_top_log_probs: torch.Tensor | None = attrs.field(default=None, validator=_optional_tensor)

    def __attrs_post_init__(self):
        shape = self.response_mask.shape
        for name in ("log_probs", "old_log_probs", "advantages", "ref_log_probs", "entropy", "rollout_log_probs",
                     "teacher_log_probs"):
            t = getattr(self, name)
            if t is not None and t.shape != shape:
                raise ValueError(f"{name} must have the shape of response_mask {tuple(shape)}, got {tuple(t.shape)}")
        teacher, student = self.teacher_top_log_probs, self.student_top_log_probs
        if (teacher is None) != (student is None):
            raise ValueError("teacher_top_log_probs and student_top_log_probs come together (both or neither)")
        if teacher is not None and (teacher.shape != student.shape or teacher.dim() != 3 or teacher.shape[:2] != shape):
            raise ValueError(
                f"teacher_top_log_probs and student_top_log_probs must both be [N, T, k] with [N, T] = "
                f"{tuple(shape)}, got {tuple(teacher.shape)} and {tuple(student.shape)}"
            )
        for name in ("global_num_tokens", "global_num_sequences"):
            _check_divisor(name, getattr(self, name))
        # A NaN/inf advantage on a valid token would silently poison the loss (or flip its sign).
        if self.advantages.is_floating_point():
            bad = ~torch.isfinite(self.advantages) & self.response_mask.bool()
            if bool(bad.any()):
                row, col = (int(i) for i in bad.nonzero()[0])
                raise ValueError(
                    f"advantages must be finite on every valid token; {int(bad.sum())} are not, the first at "
                    f"sample {row}, token {col}: {self.advantages[row, col].item()} (check the method's "
                    "normalize_rewards / compute_advantages)"
                )


def _check_divisor(name: str, value) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number (a count of the whole mini-batch) or None, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(
            f"{name} must be a positive finite count (the loss is divided by it), got {value!r}; a batch "
            "without valid tokens has no loss to normalize"
        )


class AlgorithmOutputError(ValueError):
    """An algorithm stage (a user's override, typically) returned something relax cannot train on.

    The message names the class, the method and, when known, the training step."""


def _where(algorithm, method: str, step: int | None) -> str:
    return f"{type(algorithm).__name__}.{method}" + (f" at step {step}" if step is not None else "")


def check_normalized_rewards(algorithm, normalized, expected_shape, *, step: int | None = None) -> None:
    """The output of ``algorithm.normalize_rewards``: a float ``[N]`` tensor, finite everywhere."""
    where = _where(algorithm, "normalize_rewards", step)
    if not isinstance(normalized, torch.Tensor):
        raise AlgorithmOutputError(f"{where} returned a {type(normalized).__name__}; it must return a float tensor [N]")
    if tuple(normalized.shape) != tuple(expected_shape):
        raise AlgorithmOutputError(
            f"{where} returned shape {tuple(normalized.shape)}, expected {tuple(expected_shape)} (one scalar per sample)"
        )
    if not normalized.is_floating_point():
        raise AlgorithmOutputError(
            f"{where} returned a {normalized.dtype} tensor; it must return floats (e.g. rewards.float())"
        )
    bad = ~torch.isfinite(normalized)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise AlgorithmOutputError(
            f"{where} returned {int(bad.sum())} non-finite value(s), the first at sample {i}: "
            f"{normalized[i].item()} (e.g. a division by a zero standard deviation)"
        )


def check_advantages_output(algorithm, output, expected_shape, *, step: int | None = None) -> None:
    """The output of ``algorithm.compute_advantages``: ``(advantages, returns)``, two float tensors
    of the response mask's shape ``[N, T]``."""
    where = _where(algorithm, "compute_advantages", step)
    if not (isinstance(output, tuple) and len(output) == 2):
        raise AlgorithmOutputError(
            f"{where} returned a {type(output).__name__}; it must return (advantages, returns), two float "
            f"tensors of shape {tuple(expected_shape)} (the response mask's)"
        )
    for name, tensor in zip(("advantages", "returns"), output):
        if not isinstance(tensor, torch.Tensor):
            raise AlgorithmOutputError(f"{where} returned {name} of type {type(tensor).__name__}; it must be a tensor")
        if tuple(tensor.shape) != tuple(expected_shape):
            raise AlgorithmOutputError(
                f"{where} returned {name} of shape {tuple(tensor.shape)}, expected {tuple(expected_shape)}: one "
                "value per response token, the shape of inputs.response_mask (e.g. broadcast a per-sample "
                "[N, 1] value with .expand_as(inputs.response_mask) and zero it outside the mask)"
            )
        if not tensor.is_floating_point():
            raise AlgorithmOutputError(f"{where} returned {name} as a {tensor.dtype} tensor; it must hold floats")


def _is_builtin(algorithm) -> bool:
    return type(algorithm).__module__.startswith("relax.algorithms.")


def check_policy_loss_output(algorithm, output, *, step: int | None = None) -> None:
    """The output of ``algorithm.policy_loss``: a ``PolicyLossOutput`` whose loss is a finite scalar."""
    where = _where(algorithm, "policy_loss", step)
    if not isinstance(output, PolicyLossOutput):
        raise AlgorithmOutputError(
            f"{where} returned a {type(output).__name__}; it must return PolicyLossOutput(loss=..., metrics=...)"
        )
    loss = output.loss
    if not isinstance(loss, torch.Tensor):
        raise AlgorithmOutputError(f"{where} returned a loss of type {type(loss).__name__}; it must be a tensor")
    if loss.dim() != 0:
        raise AlgorithmOutputError(
            f"{where} returned a loss of shape {tuple(loss.shape)}; it must be a scalar (reduce it, e.g. .sum())"
        )
    if not loss.is_floating_point():
        raise AlgorithmOutputError(f"{where} returned a {loss.dtype} loss; it must be a float tensor")
    if not bool(torch.isfinite(loss.detach())):
        if _is_builtin(algorithm):  # its loss is finite on finite inputs: the inputs went non-finite
            raise AlgorithmOutputError(
                f"{where} returned a non-finite loss ({loss.item()}): the built-in method's loss is finite on "
                "finite inputs, so the model's log-probabilities or the advantages were not, which usually means "
                "the learning rate is too high for this model (the weights diverged); lower --lr (keep --clip-grad "
                "on), or check the rewards for huge values. The weights were not updated with it"
            )
        raise AlgorithmOutputError(
            f"{where} returned a non-finite loss ({loss.item()}); the weights were not updated with it"
        )


@attrs.frozen
class PolicyLossOutput:
    """A differentiable scalar ``loss`` and detached scalar ``metrics`` (name -> 0-dim tensor).

    Metrics are additive shares like the loss: normalized with the same global divisors
    (``PolicyLossInputs.global_num_tokens`` / ``global_num_sequences``), so the sum over the
    micro-batches and data-parallel ranks of one optimizer step is the full mini-batch value.
    A per-micro-batch statistic that is not naturally a share (e.g. M2PO's ``m2_before``) is
    weighted by this micro-batch's share of the global valid tokens, so that the sum is its
    token-weighted mean over the mini-batch. Backends sum the metrics over micro-batches and the
    runtime sums them over data-parallel ranks. Without global divisors the metrics are this
    batch's own values (a share of 1).
    """

    loss: torch.Tensor
    metrics: Mapping[str, torch.Tensor] = attrs.field(factory=dict)
