"""The frozen models' passes on an actor rank: the reference policy's per-token log-probs of a shard
(the KL term's other side) and the teacher's (``TeacherPass``, for a method that declares
``needs_teacher``).

The reference model is frozen and plain torch whatever ``--backend`` trains the policy, so the actor
runs its forward itself: in ``--micro-batch-size`` rows (the whole shard without it), or with
``--max-tokens-per-micro-batch`` in the policy's packed micro-batches of at most that many real
tokens (``relax.backends.token_budget``), so that the reference pass needs no more memory than the
policy's passes do.

The teacher (``--teacher-checkpoint``) runs the same way for the same reasons: each actor rank scores
its own shard (no extra process, no transfer), in the policy's micro-batches, sharded with the policy
under ``--sharding fsdp``. It scores the distribution the student is scored on, the rollout
temperature and kept-set rule, so that ``log pi_teacher - log pi_student`` compares like with like.
Its log-probs go into the shard as ``teacher_log_probs`` (``[N, T]``, zero outside the response),
which the loss reads as ``PolicyLossInputs.teacher_log_probs``.

A distillation method that also reads the teacher's distribution over the vocabulary (GKD) gets, from the
same micro-batches, each position's top-k tokens of a frozen model (``frozen_top_k``): one micro-batch's
``[n, T, V]`` at a time, ``[N, T, k]`` kept.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from relax.algorithms.numerics.distill_divergence import teacher_top_k
from relax.backends import token_budget
from relax.config.run import RunConfig
from relax.models import packing
from relax.models.batch import TokenBatch, masked_row, response_log_probs
from relax.models.factory import forward_logits_fn
from relax.models.packed_forward import packed_log_probs
from relax.models.sampled_distribution import Truncation
from relax.models.teacher import load_teacher_model

TEACHER_TIME_KEY = "time/actor/teacher_s"  # the teacher's seconds on this rank in one step


@torch.no_grad()
def reference_log_probs(model: nn.Module, batch: TokenBatch, config: RunConfig) -> torch.Tensor:
    """``[N, T]`` log-probs of ``batch``'s response tokens under ``model``, zero outside the response."""
    # the reference scores the distribution the policy is scored on: the same temperature and kept-set rule
    temperature, truncation = config.rollout_temperature, Truncation.of_run(config)
    if config.max_tokens_per_micro_batch:
        return token_budget.packed_log_probs_within(model, batch, config.max_tokens_per_micro_batch,
                                                    temperature=temperature, truncation=truncation)
    forward = forward_logits_fn(config)
    device = next(model.parameters()).device
    batch = batch if batch.prompt_ids.device == device else batch.to(device)
    size = config.micro_batch_size or len(batch)
    parts = []
    for start in range(0, len(batch), size):
        sub = batch.select(slice(start, start + size))
        logits = forward(model, sub.input_ids, sub.attention_mask, sub.position_ids)
        parts.append(response_log_probs(logits, sub, with_entropy=False, temperature=temperature,
                                        truncation=truncation).log_probs)
    return torch.cat(parts)


@torch.no_grad()
def frozen_top_k(model: nn.Module, batch: TokenBatch, config: RunConfig,
                 k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(log_probs float32 [N, T], ids int64 [N, T, k'], top float32 [N, T, k'])`` from one forward pass
    per micro-batch: ``reference_log_probs``'s per-token log-probs (the same values: the same forward and
    micro-batches, scored by the same function), and at each response position the k' = min(k, V) most
    likely tokens of ``model`` (``k`` 0: the whole vocabulary, in token order) with their log-probs.
    Positions outside the response hold arbitrary tokens (the loss masks them)."""
    temperature, truncation = config.rollout_temperature, Truncation.of_run(config)
    device = next(model.parameters()).device
    batch = batch if batch.prompt_ids.device == device else batch.to(device)
    log_probs_out = torch.zeros(batch.response_ids.shape, dtype=torch.float32, device=device)
    ids_out = top_out = None
    for rows, scored in _distributions(model, batch, config, temperature, truncation):
        ids, top = teacher_top_k(scored.all_log_probs, k)
        if ids_out is None:
            shape = (len(batch), batch.response_ids.shape[1], ids.shape[-1])
            ids_out = torch.zeros(shape, dtype=torch.long, device=device)
            top_out = torch.zeros(shape, dtype=top.dtype, device=device)
        log_probs_out[rows], ids_out[rows], top_out[rows] = scored.log_probs, ids, top
    return log_probs_out, ids_out, top_out


def _distributions(model, batch, config, temperature, truncation):
    """``(rows, TokenLogProbs with the [n, T, V] distribution)`` per micro-batch: packed within the token
    budget, else in ``--micro-batch-size`` rows."""
    if config.max_tokens_per_micro_batch:
        plan = packing.plan_micro_batches(packing.sample_lengths(batch), config.max_tokens_per_micro_batch)
        for group in plan.groups:
            rows = torch.tensor(group, dtype=torch.long, device=batch.prompt_ids.device)
            yield rows, packed_log_probs(model, batch, rows, with_entropy=False, temperature=temperature,
                                         truncation=truncation, with_distribution=True)
        return
    forward = forward_logits_fn(config)
    size = config.micro_batch_size or len(batch)
    for start in range(0, len(batch), size):
        rows = slice(start, start + size)
        sub = batch.select(rows)
        logits = forward(model, sub.input_ids, sub.attention_mask, sub.position_ids)
        yield rows, response_log_probs(logits, sub, with_entropy=False, temperature=temperature,
                                       truncation=truncation, with_distribution=True)


class TeacherPass:
    """The frozen teacher of one actor rank and its forward pass."""

    def __init__(self, config, student: torch.nn.Module, device: torch.device | None = None):
        self.config = config
        self.model = load_teacher_model(config, student, device=device)

    def shard_with(self, backend) -> None:
        """Shard the teacher like the policy when the backend shards (``forward_is_collective``)."""
        if backend.forward_is_collective:
            self.model = backend.shard_frozen(self.model)

    def log_probs(self, batch: TokenBatch, backend) -> torch.Tensor:
        """``[N, T]`` teacher log-probs of ``batch``'s response tokens, on the batch's device."""
        if backend.forward_is_collective:  # sharded: the backend keeps the ranks in lock-step
            return backend.frozen_log_probs(self.model, batch, micro_batch_size=self.config.micro_batch_size)
        return reference_log_probs(self.model, batch, self.config).to(batch.response_ids.device)

    def add_to(self, shard: dict, batch: TokenBatch | None, backend, top_k: int | None = None) -> None:
        """``shard["teacher_log_probs"]`` for this rank's rows and the pass's seconds
        (``TEACHER_TIME_KEY``). A rank without rows still joins a sharded backend's collective pass. ``top_k``
        (the method's ``teacher_top_k()``, GKD): also ``shard["teacher_top_ids"]`` /
        ``shard["teacher_top_log_probs"]`` ``[N, T, k]``, from the same forward pass (``frozen_top_k``;
        never sharded: such a method is refused on the sharding backends)."""
        t0 = time.perf_counter()
        if batch is None:
            if backend.forward_is_collective:
                self.log_probs(masked_row().select(slice(0, 0)), backend)
        elif top_k is not None:
            log_probs, ids, top = frozen_top_k(self.model, batch, self.config, top_k)
            shard["teacher_log_probs"] = log_probs.to(batch.response_ids.device)
            shard["teacher_top_ids"], shard["teacher_top_log_probs"] = ids, top
        else:
            shard["teacher_log_probs"] = self.log_probs(batch, backend)
        shard[TEACHER_TIME_KEY] = time.perf_counter() - t0
