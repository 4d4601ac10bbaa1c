"""``TorchBackend``: the plain-torch training backend (CPU or one GPU per rank).

Wraps any causal LM whose forward maps ``(input_ids, attention_mask, position_ids)`` to logits —
the built-in ``TinyCausalLM`` or a transformers ``*ForCausalLM`` (``default_forward_logits`` reads
``.logits`` from a model output object). Pass ``forward_logits=`` for anything else.

Per-token log-probs: the logits at column ``P + t - 1`` score response token ``t``; they are taken
with ``log_softmax`` in float32 (stable for bf16/fp16 models) and zeroed where the response mask is
false. Entropy is that of the full distribution at each response position.

Data parallelism (optional): with ``process_group`` given, gradients are all-reduced after the
backward passes of a step and before clipping. ``dp_grad_reduction="sum"`` (default) fits the
contract of ``PolicyLossInputs``: the loss is divided by *global* token/sequence counts, so the
whole-batch gradient is the sum of the ranks' gradients. Use ``"mean"`` when each rank's loss is
already a mean over the whole batch's worth of data (e.g. normalised by local counts on equal shards).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping

import torch
import torch.distributed as dist
from torch import nn

from relax.backends.base import LossFn, TrainingBackend
from relax.models.batch import (
    ForwardLogits,
    TokenBatch,
    TokenLogProbs,
    TokenValues,
    default_forward_logits,
    response_log_probs,
)
from relax.models.value import response_values


def config_errors(config) -> list[str]:
    """What a ``RunConfig`` asks of ``--backend torch`` that it cannot do."""
    tp, pp = config.tensor_model_parallel_size, config.pipeline_model_parallel_size
    if tp != 1 or pp != 1:
        return [
            f"--tensor-model-parallel-size / --pipeline-model-parallel-size ({tp} / {pp}) need "
            f"--backend megatron; the {config.backend} backend is data-parallel only"
        ]
    return []


class TorchBackend(TrainingBackend):
    """One data-parallel rank: a model, AdamW, gradient clipping, optional gradient all-reduce.

    ``temperature`` divides the logits before the softmax, to match a rollout that sampled at that
    temperature (1.0 for the default recipe). ``clip_grad`` <= 0 or None disables clipping; the
    pre-clip ``grad_norm`` is reported either way. With ``value_head`` the model is a
    ``ValueModel`` and the loss receives ``TokenValues`` instead of log-probs (PPO's critic).

    Every rank holds the whole model, so rank 0 alone answers ``state_dict`` / ``export_weights``.
    """

    name = "torch"
    supports_critic = True

    @classmethod
    def for_policy(cls, config, model: nn.Module, *, process_group=None) -> "TorchBackend":
        from relax.models.factory import forward_logits_fn

        return cls(model, lr=config.lr, clip_grad=config.clip_grad, temperature=config.rollout_temperature,
                   process_group=process_group, forward_logits=forward_logits_fn(config))

    @classmethod
    def for_critic(cls, config, model: nn.Module, *, process_group=None) -> "TorchBackend":
        return cls(model, lr=config.critic_lr, clip_grad=config.clip_grad, process_group=process_group,
                   value_head=True)


    def __init__(
        self,
        model: nn.Module,
        *,
        lr: float = 3e-4,
        betas: tuple[float, float] = (0.9, 0.999),
        weight_decay: float = 0.0,
        eps: float = 1e-8,
        clip_grad: float | None = 1.0,
        temperature: float = 1.0,
        process_group: dist.ProcessGroup | None = None,
        dp_grad_reduction: str = "sum",
        forward_logits: ForwardLogits = default_forward_logits,
        value_head: bool = False,
    ):
        if dp_grad_reduction not in ("sum", "mean"):
            raise ValueError(f"dp_grad_reduction must be 'sum' or 'mean', got {dp_grad_reduction!r}")
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.model = model
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad], lr=lr, betas=betas, weight_decay=weight_decay, eps=eps
        )
        self.clip_grad = clip_grad
        self.temperature = temperature
        self.process_group = process_group
        self.dp_grad_reduction = dp_grad_reduction
        self.forward_logits = forward_logits
        self.value_head = value_head
        self.step = 0

    @property
    def process_group(self) -> dist.ProcessGroup | None:
        return self._process_group

    @process_group.setter
    def process_group(self, group: dist.ProcessGroup | None) -> None:
        # The data-parallel identity follows the group: every rank of a torch group holds a shard.
        self._process_group = group
        self.dp_group = group
        self.dp_rank = dist.get_rank(group) if group is not None else 0
        self.dp_size = dist.get_world_size(group) if group is not None else 1

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _forward(self, batch: TokenBatch, *, with_entropy: bool) -> TokenLogProbs | TokenValues:
        batch = _to_device(batch, self.device)
        if self.value_head:
            return TokenValues(values=response_values(self.model, batch))
        logits = self.forward_logits(self.model, batch.input_ids, batch.attention_mask, batch.position_ids)
        return response_log_probs(logits, batch, with_entropy=with_entropy, temperature=self.temperature)

    @torch.no_grad()
    def compute_log_probs(
        self, batch: TokenBatch, *, with_entropy: bool = False, micro_batch_size: int | None = None
    ) -> TokenLogProbs:
        was_training = self.model.training
        self.model.eval()
        try:
            parts = [self._forward(batch.select(rows), with_entropy=with_entropy) for rows in _slices(len(batch), micro_batch_size)]
        finally:
            self.model.train(was_training)
        return TokenLogProbs(
            log_probs=torch.cat([x.log_probs for x in parts]),
            entropy=torch.cat([x.entropy for x in parts]) if with_entropy else None,
        )

    @torch.no_grad()
    def compute_values(self, batch: TokenBatch, *, micro_batch_size: int | None = None) -> torch.Tensor:
        """Critic values ``[N, T]`` of the response positions, without gradients (``value_head`` only)."""
        if not self.value_head:
            raise TypeError("compute_values needs a value-head backend (TorchBackend.for_critic)")
        was_training = self.model.training
        self.model.eval()
        try:
            parts = [self._forward(batch.select(rows), with_entropy=False).values
                     for rows in _slices(len(batch), micro_batch_size)]
        finally:
            self.model.train(was_training)
        return torch.cat(parts)

    def train_step(
        self, batch: TokenBatch, loss_fn: LossFn, *, micro_batch_size: int | None = None, with_entropy: bool = True
    ) -> dict[str, float]:
        self.model.train()
        self.optimizer.zero_grad(set_to_none=False)
        # Loss and metrics are shares of the mini-batch (PolicyLossOutput): both are summed.
        total_loss, sums = 0.0, {}
        for rows in _slices(len(batch), micro_batch_size):
            out = loss_fn(self._forward(batch.select(rows), with_entropy=with_entropy), rows)
            out.loss.backward()
            total_loss += float(out.loss.detach())
            for name, value in out.metrics.items():
                sums[name] = sums.get(name, 0.0) + float(value)
        params = [p for p in self.model.parameters() if p.requires_grad]
        self._all_reduce_gradients(params)
        max_norm = self.clip_grad if self.clip_grad and self.clip_grad > 0 else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        if not math.isfinite(grad_norm):
            # Every rank sees the same (all-reduced) gradients, so every rank raises here together.
            self.optimizer.zero_grad(set_to_none=False)
            raise FloatingPointError(
                f"non-finite gradient norm ({grad_norm}) at optimizer step {self.step + 1} (loss {total_loss}); "
                "the step was not applied. Lower --lr or check the rewards/advantages for extreme values."
            )
        self.optimizer.step()
        self.step += 1
        metrics = dict(sums)
        metrics.update(loss=total_loss, grad_norm=grad_norm, lr=self.optimizer.param_groups[0]["lr"])
        return metrics

    def _all_reduce_gradients(self, params: list[torch.Tensor]) -> None:
        if self.process_group is None:
            return
        world = dist.get_world_size(self.process_group)
        for p in params:
            if p.grad is None:  # keep every rank's collective sequence identical
                p.grad = torch.zeros_like(p)
        # One flat buffer: a single collective per step instead of one per parameter.
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=self.process_group)
        if self.dp_grad_reduction == "mean":
            flat /= world
        offset = 0
        for p in params:
            n = p.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
            offset += n

    def state_dict(self) -> dict:
        return {
            "model": {k: v.detach().clone() for k, v in self.model.state_dict().items()},
            "optimizer": copy.deepcopy(self.optimizer.state_dict()),
            "step": self.step,
        }

    def load_state_dict(self, state: Mapping) -> None:
        missing = {"model", "optimizer", "step"} - set(state)
        if missing:
            raise KeyError(f"TorchBackend state is missing {sorted(missing)}; was it saved by TorchBackend.state_dict()?")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(copy.deepcopy(state["optimizer"]))
        self.step = int(state["step"])

    def export_weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}


def _slices(n: int, micro_batch_size: int | None) -> list[slice]:
    if micro_batch_size is None or micro_batch_size >= n:
        return [slice(0, n)]
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    return [slice(i, min(i + micro_batch_size, n)) for i in range(0, n, micro_batch_size)]


def _to_device(batch: TokenBatch, device: torch.device) -> TokenBatch:
    if batch.prompt_ids.device == device:
        return batch
    return TokenBatch(
        prompt_ids=batch.prompt_ids.to(device),
        prompt_mask=batch.prompt_mask.to(device),
        response_ids=batch.response_ids.to(device),
        response_mask=batch.response_mask.to(device),
    )
