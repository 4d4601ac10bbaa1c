"""``TorchBackend``: the plain-torch training backend (CPU or one GPU per rank).

Wraps any causal LM whose forward maps ``(input_ids, attention_mask, position_ids)`` to logits —
the built-in ``TinyCausalLM`` or a transformers ``*ForCausalLM`` (``default_forward_logits`` reads
``.logits`` from a model output object). Pass ``forward_logits=`` for anything else.

Per-token log-probs: the logits at column ``P + t - 1`` score response token ``t``; they are taken
with ``log_softmax`` in float32 (stable for bf16/fp16 models) and zeroed where the response mask is
false. Entropy is that of the full distribution at each response position.

Token-budget micro-batches (``max_tokens_per_micro_batch``, ``--max-tokens-per-micro-batch``): the
policy's passes group the samples by real token count and run each group as one padding-free packed
row (``relax.models.packing``); the loss still receives ``[n, T]`` log-probs of the group's rows, so
its mini-batch denominators are unchanged. Not for the critic (``value_head``) nor a custom
``forward_logits``.

Data parallelism (optional): with ``process_group`` given, gradients are all-reduced after the
backward passes of a step and before clipping. ``dp_grad_reduction="sum"`` (default) fits the
contract of ``PolicyLossInputs``: the loss is divided by *global* token/sequence counts, so the
whole-batch gradient is the sum of the ranks' gradients. Use ``"mean"`` when each rank's loss is
already a mean over the whole batch's worth of data (e.g. normalised by local counts on equal shards).
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Mapping

import torch
import torch.distributed as dist
from torch import nn

from relax.backends import optim, token_budget
from relax.backends.base import LossFn, TrainingBackend
from relax.backends.torch_setup import backend_options, enable_recompute, lora_config_errors
from relax.backends.torch_state import check_state, cpu_copy
from relax.config.run import RunConfig
from relax.models import packing
from relax.models.batch import (
    ForwardLogits,
    TokenBatch,
    TokenLogProbs,
    TokenValues,
    default_forward_logits,
    response_log_probs,
)
from relax.models.packed_forward import packed_attention, packed_log_probs
from relax.models.sampled_distribution import Truncation
from relax.models.value import response_values


class TorchBackend(TrainingBackend):
    """One data-parallel rank: a model, AdamW, gradient clipping, optional gradient all-reduce.

    ``temperature`` divides the logits before the softmax, to match a rollout that sampled at that
    temperature (1.0 for the default recipe); ``truncation`` restricts it to the rollout's kept set
    (``relax.models.sampled_distribution``). ``clip_grad`` <= 0 or None disables clipping; the
    pre-clip ``grad_norm`` is reported either way. With ``value_head`` the model is a
    ``ValueModel`` and the loss receives ``TokenValues`` instead of log-probs (PPO's critic).

    Every rank holds the whole model, so rank 0 alone answers ``state_dict`` / ``export_weights``.

    From a ``RunConfig`` (``for_policy`` / ``for_critic``): AdamW with ``--weight-decay`` on all but
    biases and norms and the ``--adam-*`` flags, the learning-rate ``schedule`` (``relax.backends.optim``)
    applied before each step, ``--bf16`` autocast over float32 weights, ``--recompute-activations``,
    and ``--lora-rank`` (a ``peft`` model: only the adapter trains, and ``export_weights`` /
    ``state_dict`` hold the adapter payload of ``relax.models.hf.lora``).
    """

    name = "torch"
    supports_critic = True
    sharding_modes = ("none", "fsdp")  # --sharding fsdp: relax.backends.sharded_backend
    packs_micro_batches = True
    gives_distributions = True

    @classmethod
    def config_errors(cls, config: RunConfig) -> list[str]:
        """What a ``RunConfig`` asks of ``--backend torch`` that it cannot do."""
        from relax.backends.sharding import config_errors as sharding_errors

        errors = optim.config_errors(config) + lora_config_errors(config) + sharding_errors(config)
        tp, pp = config.tensor_model_parallel_size, config.pipeline_model_parallel_size
        if tp != 1 or pp != 1:
            errors.append(
                f"--tensor-model-parallel-size / --pipeline-model-parallel-size ({tp} / {pp}) need "
                f"--backend megatron; the {config.backend} backend is data-parallel only"
            )
        return errors

    @classmethod
    def for_policy(cls, config, model: nn.Module, *, process_group=None) -> TorchBackend:
        from relax.models.factory import forward_logits_fn

        if config.recompute_activations:
            enable_recompute(model)
        if config.lora_rank:
            from relax.models.hf.lora import wrap_with_lora

            model = wrap_with_lora(model, rank=config.lora_rank, alpha=config.lora_alpha,
                                   dropout=config.lora_dropout, target_modules=config.lora_target_modules)
        if config.sharding != "none" and process_group is not None:  # --sharding fsdp (relax.backends.sharding)
            from relax.backends.sharding import sharded_backend_class

            cls = sharded_backend_class(config.sharding)
        return cls(model, clip_grad=config.clip_grad, temperature=config.rollout_temperature,
                   truncation=Truncation.of_run(config), process_group=process_group,
                   forward_logits=forward_logits_fn(config),
                   max_tokens_per_micro_batch=config.max_tokens_per_micro_batch, **backend_options(config, optim.lr_schedule(config)))

    @classmethod
    def for_critic(cls, config, model: nn.Module, *, process_group=None) -> TorchBackend:
        if config.recompute_activations:
            enable_recompute(model)
        return cls(model, clip_grad=config.clip_grad, process_group=process_group, value_head=True,
                   **backend_options(config, optim.lr_schedule(config, peak=config.critic_lr)))

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
        truncation: Truncation | None = None,
        process_group: dist.ProcessGroup | None = None,
        dp_grad_reduction: str = "sum",
        forward_logits: ForwardLogits = default_forward_logits,
        value_head: bool = False,
        schedule: optim.LRSchedule | None = None,
        bf16: bool = False,
        max_tokens_per_micro_batch: int | None = None,
    ):
        if dp_grad_reduction not in ("sum", "mean"):
            raise ValueError(f"dp_grad_reduction must be 'sum' or 'mean', got {dp_grad_reduction!r}")
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.model = model
        self.optimizer = torch.optim.AdamW(
            optim.param_groups(model.named_parameters(), weight_decay), lr=lr, betas=betas,
            weight_decay=weight_decay, eps=eps,
        )
        # None or constant: the optimizer's own rate, never touched (bit-identical to no schedule).
        self.schedule = None if schedule is None or schedule.is_constant else schedule
        self.bf16 = bf16
        self.clip_grad = clip_grad
        self.temperature = temperature
        self.truncation = truncation  # the sampling's kept set, replayed (relax.models.sampled_distribution)
        self.process_group = process_group
        self.dp_grad_reduction = dp_grad_reduction
        self.forward_logits = forward_logits
        self.value_head = value_head
        self.max_tokens_per_micro_batch = token_budget.checked_budget(max_tokens_per_micro_batch, value_head, forward_logits)
        self.last_pack_plan: packing.PackPlan | None = None  # the latest packed pass's grouping
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

    def _forward(self, batch: TokenBatch, *, with_entropy: bool,
                 with_distribution: bool = False) -> TokenLogProbs | TokenValues:
        batch = _to_device(batch, self.device)
        with self._autocast():
            if self.value_head:
                return TokenValues(values=response_values(self.model, batch))
            logits = self.forward_logits(self.model, batch.input_ids, batch.attention_mask, batch.position_ids)
        # float32 log-softmax (outside autocast) whatever the compute precision
        return response_log_probs(logits, batch, with_entropy=with_entropy, temperature=self.temperature,
                                  truncation=self.truncation, with_distribution=with_distribution)

    def _forward_packed(self, batch: TokenBatch, rows: torch.Tensor, *, with_entropy: bool,
                        with_distribution: bool = False) -> TokenLogProbs:
        """``_forward`` of ``batch``'s ``rows`` as one padding-free packed row (``batch`` on the device)."""
        return packed_log_probs(self.model, batch, rows, with_entropy=with_entropy, temperature=self.temperature,
                                autocast=self._autocast, truncation=self.truncation,
                                with_distribution=with_distribution)

    def _micro_batches(self, batch: TokenBatch, micro_batch_size: int | None, *, with_entropy: bool, **outputs):
        """``(rows, TokenLogProbs)`` per micro-batch, each forward run when its item is reached (so a
        caller's backward frees its activations before the next one). ``rows``: a slice of
        ``micro_batch_size`` rows, or with the token budget the index tensor of one packed group.
        ``outputs``: more of the forward's keywords (``with_distribution``)."""
        if not self.max_tokens_per_micro_batch or len(batch) == 0:
            for rows in _slices(len(batch), micro_batch_size):
                yield rows, self._forward(batch.select(rows), with_entropy=with_entropy, **outputs)
            return
        batch = _to_device(batch, self.device)
        plan = packing.plan_micro_batches(packing.sample_lengths(batch), self.max_tokens_per_micro_batch)
        self.last_pack_plan = plan
        for group in plan.groups:
            rows = torch.tensor(group, dtype=torch.long, device=self.device)
            yield rows, self._forward_packed(batch, rows, with_entropy=with_entropy, **outputs)

    def _autocast(self):
        """``--bf16``: the forward (and so the backward) computes in bfloat16 while the parameters,
        their gradients and the Adam state stay float32 (autocast casts weights per operation)."""
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16, enabled=self.bf16)

    @torch.no_grad()
    def compute_log_probs(
        self, batch: TokenBatch, *, with_entropy: bool = False, micro_batch_size: int | None = None
    ) -> TokenLogProbs:
        was_training = self.model.training
        self.model.eval()
        try:
            parts = list(self._micro_batches(batch, micro_batch_size, with_entropy=with_entropy))
        finally:
            self.model.train(was_training)
        if self.max_tokens_per_micro_batch and len(batch):
            return token_budget.in_row_order(parts, len(batch), with_entropy)
        return TokenLogProbs(
            log_probs=torch.cat([x.log_probs for _, x in parts]),
            entropy=torch.cat([x.entropy for _, x in parts]) if with_entropy else None,
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
        self, batch: TokenBatch, loss_fn: LossFn, *, micro_batch_size: int | None = None, with_entropy: bool = True,
        with_distribution: bool = False,
    ) -> dict[str, float]:
        self.model.train()
        self.optimizer.zero_grad(set_to_none=False)
        # Loss and metrics are shares of the mini-batch (PolicyLossOutput): both are summed.
        total_loss, sums = 0.0, {}
        # packed: the backward passes attend like the forward ones (recomputed activations)
        with packed_attention(self.model) if self.max_tokens_per_micro_batch else contextlib.nullcontext():
            for rows, token_log_probs in self._micro_batches(batch, micro_batch_size, with_entropy=with_entropy,
                                                             with_distribution=with_distribution):
                out = loss_fn(token_log_probs, rows)
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
        if self.schedule is not None:
            optim.set_learning_rate(self.optimizer, self.schedule.lr(self.step))
        self.optimizer.step()
        self.step += 1
        metrics = dict(sums)
        if self.max_tokens_per_micro_batch and len(batch):
            metrics.update(token_budget.packing_metrics(self.last_pack_plan, batch))
        metrics.update(loss=total_loss, grad_norm=grad_norm, lr=self.optimizer.param_groups[0]["lr"],
                       optimizer_state_mib=optim.optimizer_state_bytes(self.optimizer) / 2**20)
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

    @property
    def lora(self) -> bool:
        """Does this backend train LoRA adapters (a ``peft`` model, ``--lora-rank``)?"""
        return hasattr(self.model, "peft_config")

    def state_dict(self) -> dict:
        """``model``: the whole weights, or with LoRA only the adapter payload (what the rollout and
        the Hugging Face export merge into the base checkpoint). Every tensor is a CPU copy: the state
        leaves this process (a checkpoint file, the driver), which may have no GPU; ``load_state_dict``
        puts it back on the model's device."""
        return {
            "model": self.export_weights(),
            "optimizer": cpu_copy(self.optimizer.state_dict()),
            "optimizer_param_names": optim.param_names(self.model, self.optimizer),
            "step": self.step,
        }

    def load_state_dict(self, state: Mapping) -> None:
        check_state(state)
        if self.lora:
            from relax.models.hf.lora import load_adapter

            load_adapter(self.model, state["model"])
        else:
            self.model.load_state_dict(state["model"])
        names = optim.param_names(self.model, self.optimizer)
        # Checkpoints from before the name list held one group of the trainable parameters in order.
        saved_names = state.get("optimizer_param_names") or [n for n, p in self.model.named_parameters()
                                                              if p.requires_grad]
        self.optimizer.load_state_dict(
            optim.regrouped_state(copy.deepcopy(state["optimizer"]), saved_names, self.optimizer, names))
        self.step = int(state["step"])

    def export_weights(self) -> dict[str, torch.Tensor]:
        """The whole weights in the model's own names; with LoRA only the adapter payload
        (``relax.models.hf.lora``): the rollout merges it into its copy of the base model."""
        if self.lora:
            from relax.models.hf.lora import adapter_payload

            return adapter_payload(self.model)
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
    return batch.to(device)  # the multi-turn attention mask travels too
