"""``MegatronBackend``: one rank of a megatron-core model (tensor, pipeline and data parallel).

Every rank of the job constructs one ``MegatronBackend`` and calls the same methods in the same
order (they are collectives). Data parallelism: each DP rank passes its own shard of the batch;
tensor/pipeline ranks of one model replica pass the same shard.

Loss scaling. The backend contract says the micro-batch losses are *summed* and the loss function
normalizes by whole-batch counts taken over all DP ranks (``PolicyLossInputs.global_num_tokens``), so
the full-batch gradient is the *sum* of the per-rank gradients. Megatron's schedule divides each
micro-batch loss by the number of micro-batches and Megatron DDP averages gradients over DP; the
loss handed to Megatron is therefore multiplied by ``num_microbatches * dp_size`` to undo both.

Devices. A rank trains on its CUDA device when torch sees one (``placement.training_device``, made
current before megatron-core allocates anything), else on the CPU, the only place the
``_cpu_compat`` patches go in. Batches may arrive on the CPU: they are moved to the model's device,
and the log-probs come back from there (like the torch backend's). Whole weights (``export_weights``,
``state_dict``, ``gradients``) leave the rank as CPU tensors.

Parts. This module builds the rank (model, DDP, optimizer) and holds the ``TrainingBackend`` methods;
the batch's forward pass is ``forward.ForwardPass``, the micro-batch schedule
``schedule.MicroBatchSchedule``, the optimizer's tensors and the checkpoint
``optimizer_state.OptimizerState``, and the process groups ``process_groups``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping

import torch
import torch.distributed as dist

from relax.backends import optim
from relax.backends.base import LossFn, TokenBatch, TokenLogProbs
from relax.backends.megatron import _cpu_compat, placement
from relax.backends.megatron.families import ModelFamily, TinyFamily, family_of
from relax.backends.megatron.forward import ForwardPass
from relax.backends.megatron.layer_specs import canonical_name
from relax.backends.megatron.model import local_tensors
from relax.backends.megatron.optimizer_state import OptimizerState
from relax.backends.megatron.process_groups import ensure_distributed, init_parallel_state
from relax.backends.megatron.rules import MegatronRules
from relax.backends.megatron.schedule import MicroBatchSchedule
from relax.models.sampled_distribution import Truncation
from relax.models.tiny.model import TinyLMConfig


class MegatronBackend(ForwardPass, MicroBatchSchedule, OptimizerState, MegatronRules):
    """``TrainingBackend`` on megatron-core: GPTModel + Megatron DDP + Megatron (Adam) optimizer.

    ``model_config`` is a model family adapter (``relax.backends.megatron.families``: the built-in
    ``TinyCausalLM`` or a Hugging Face Llama / Qwen2 / Qwen3), or a ``TinyLMConfig`` for the built-in
    model. Weights at the backend's edges (``initial_weights``, ``export_weights``, ``load_weights``,
    ``state_dict``) are in that family's naming: ``TinyCausalLM`` names, or the HF module's
    ``state_dict`` names. Without ``initial_weights`` the built-in model starts from
    ``TinyCausalLM(model_config)`` built after ``torch.manual_seed(seed)`` (the torch backend's init).
    """

    name = "megatron"
    gathers_on_all_ranks = True  # weights are sharded over tensor/pipeline ranks

    @classmethod
    def for_policy(cls, config, model, *, process_group=None) -> "MegatronBackend":
        """One actor rank, initialized from ``model`` (the built-in ``TinyCausalLM``, or the Hugging Face
        ``*ForCausalLM`` of ``--hf-checkpoint``, as the torch backend would train it) with the run's
        optimizer settings.

        Megatron builds its own data/tensor/pipeline groups on top of ``torch.distributed`` (started
        over all ``actor_num_workers`` ranks; a single rank starts a one-process group itself). Every
        rank must then call the backend's methods together; tensor/pipeline peers hold the same data
        shard (``dp_rank``) and only the first of them writes shared fields.

        The backend takes ``model`` over: once its weights are converted into this rank's shard, the
        module's own tensors are released (moved to the meta device), so that a rank does not keep a
        whole copy of the model beside its shard for the rest of the run.
        """
        family = family_of(model)  # raises, naming the fix, for a model it cannot convert
        with warnings.catch_warnings():  # megatron-core's notes on optional fused kernels, once per rank
            warnings.filterwarnings("ignore", message="Apex is not installed")
            backend = cls(
                family,
                initial_weights=model.state_dict(),
                lr=config.lr,
                schedule=optim.lr_schedule(config),
                weight_decay=config.weight_decay,
                adam_betas=(config.adam_beta1, config.adam_beta2),
                adam_eps=config.adam_eps,
                clip_grad=config.clip_grad,
                seed=config.seed,
                tensor_model_parallel_size=config.tensor_model_parallel_size,
                pipeline_model_parallel_size=config.pipeline_model_parallel_size,
                micro_batch_size=config.micro_batch_size,
                temperature=config.rollout_temperature,
                truncation=Truncation.of_run(config),
                recompute_activations=config.recompute_activations,
                bf16=config.bf16,
            )
        model.to("meta")
        return backend

    @classmethod
    def process_group_kind(cls, model) -> str:
        # the rank's model is built on its GPU whatever device ``model`` (the source weights) is on
        return placement.process_group_backend()

    @property
    def writes_shared_fields(self) -> bool:
        return self.tp_rank == 0 and self.is_first_stage

    def __init__(
        self,
        model_config: TinyLMConfig | ModelFamily,
        *,
        initial_weights: Mapping[str, torch.Tensor] | None = None,
        lr: float = 3e-4,
        schedule: optim.LRSchedule | None = None,
        clip_grad: float = 1.0,
        weight_decay: float = 0.0,
        adam_betas: tuple[float, float] = (0.9, 0.999),
        adam_eps: float = 1e-8,
        seed: int = 1234,
        tensor_model_parallel_size: int = 1,
        pipeline_model_parallel_size: int = 1,
        micro_batch_size: int | None = None,
        temperature: float = 1.0,
        truncation: Truncation | None = None,
        dp_grad_reduction: str = "sum",
        recompute_activations: bool = False,
        bf16: bool = False,
    ):
        if dp_grad_reduction not in ("sum", "mean"):
            raise ValueError(f"dp_grad_reduction must be 'sum' or 'mean', got {dp_grad_reduction!r}")
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        # The rank's CUDA device (made current: megatron-core allocates on the current device), else
        # the CPU, where (and only where) the CPU compatibility patches go in.
        device = placement.training_device()
        placement.prepare_megatron(device)
        from megatron.core import parallel_state
        from megatron.core.distributed import (
            DistributedDataParallel,
            DistributedDataParallelConfig,
            finalize_model_grads,
        )
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
        from megatron.core.transformer.module import Float16Module
        from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

        self.family = model_config if isinstance(model_config, ModelFamily) else TinyFamily(model_config)
        self.model_config = self.family.config  # has vocab_size, whatever the family
        self.micro_batch_size = micro_batch_size
        self.temperature = temperature
        self.truncation = truncation  # the sampling's kept set, replayed (relax.models.sampled_distribution)
        self.dp_grad_reduction = dp_grad_reduction
        self.steps = 0
        ensure_distributed()
        init_parallel_state(tensor_model_parallel_size, pipeline_model_parallel_size, seed)
        ps = parallel_state
        self.tp_rank, self.tp_size = ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size()
        self.pp_size = ps.get_pipeline_model_parallel_world_size()
        self.dp_rank, self.dp_size = ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()
        self.tp_group, self.pp_group = ps.get_tensor_model_parallel_group(), ps.get_pipeline_model_parallel_group()
        self.dp_group = ps.get_data_parallel_group()
        self.is_first_stage = ps.is_pipeline_first_stage()
        self.is_last_stage = ps.is_pipeline_last_stage()
        self.last_stage_rank = ps.get_pipeline_model_parallel_last_rank()

        if initial_weights is None:
            initial_weights = self.family.default_weights(seed)

        with _cpu_compat.cpu_device_scope():
            # --recompute-activations: every transformer layer keeps only its input and is recomputed
            # in the backward pass (megatron-core's "full" granularity, one layer per checkpoint)
            recompute = dict(recompute_granularity="full", recompute_method="uniform",
                             recompute_num_layers=1) if recompute_activations else {}
            # --bf16: megatron-core's mixed precision. Parameters, activations and pipeline messages
            # are bfloat16; DDP reduces gradients in float32 (grad_reduce_in_fp32) and the optimizer
            # (Float16OptimizerWithFloat16Params) steps float32 master copies with float32 Adam state,
            # then copies them back to the bfloat16 parameters.
            precision = dict(bf16=True, params_dtype=torch.bfloat16,
                             pipeline_dtype=torch.bfloat16) if bf16 else {}
            self.config = self.family.transformer_config(tp_size=self.tp_size, pp_size=self.pp_size,
                                                         **recompute, **precision)
            torch.manual_seed(seed)
            # Built on the CPU (use_cpu_initialization: the same initial values at any tp), then moved
            # to the rank's device before anything holds its parameters (DDP's buffers and the
            # optimizer are made from them, on the current CUDA device).
            module = self.family.build(self.config, pre_process=self.is_first_stage, post_process=self.is_last_stage)
            module.to(device)
            self.gpt = module  # the GPTModel itself: its parameter names are the conversions' names
            self.layer_offset = get_transformer_layer_offset(self.config)
            self._load_weights_into(module, initial_weights)
            if bf16:
                # megatron-core's mixed-precision wrapper: the module in bfloat16 (norm layers are
                # built in float32), float inputs cast on the first stage; outputs are kept in
                # bfloat16 (``fp32_output=False``): the log-probs slice the response columns first and
                # take them in float32, instead of a float32 copy of every position's logits.
                module = Float16Module(self.config, module)
            self._forward_kwargs = {"fp32_output": False} if bf16 else {}
            ddp_config = DistributedDataParallelConfig(
                grad_reduce_in_fp32=True,
                overlap_grad_reduce=False,
                use_distributed_optimizer=False,
                check_for_nan_in_grad=True,
            )
            self.model = DistributedDataParallel(self.config, ddp_config, module)
            opt_config = OptimizerConfig(
                optimizer="adam",
                lr=lr,
                weight_decay=weight_decay,
                adam_beta1=adam_betas[0],
                adam_beta2=adam_betas[1],
                adam_eps=adam_eps,
                clip_grad=clip_grad,
                fp16=False,
                bf16=bf16,
                params_dtype=torch.bfloat16 if bf16 else torch.float32,
                use_distributed_optimizer=False,
            )
            self.optimizer = get_megatron_optimizer(opt_config, [self.model])
        _cpu_compat.exempt_inner_optimizers(self.optimizer)  # CPU only: see _cpu_compat
        self.bf16 = bf16
        if bf16:
            # The optimizer copied its float32 masters from the bfloat16 parameters, i.e. rounded;
            # start them from the exact initial weights instead (the parameters stay their rounding).
            self._shard_into(self._master_params(), initial_weights)
        # Megatron marks biases and 1-D parameters with wd_mult 0 (optim.decays is the same rule),
        # but only its LR scheduler, which relax does not use, applies the multiplier: do it here.
        for group in self.optimizer.param_groups:
            group["weight_decay"] = weight_decay * group.get("wd_mult", 1.0)
        self.schedule = None if schedule is None or schedule.is_constant else schedule
        self.config.finalize_model_grads_func = finalize_model_grads
        self.config.no_sync_func = self.model.no_sync
        self.clip_grad = clip_grad

    # -- weights -----------------------------------------------------------------------------

    def _load_weights_into(self, module, weights: Mapping[str, torch.Tensor]) -> None:
        self._shard_into(local_tensors(module), weights)

    def _shard_into(self, targets: Mapping[str, torch.Tensor], weights: Mapping[str, torch.Tensor]) -> None:
        """This rank's shard of the whole ``weights`` (family naming) into ``targets`` (local Megatron names)."""
        self.family.load_into(targets, weights, tp_rank=self.tp_rank, tp_size=self.tp_size, layer_offset=self.layer_offset)

    def _gather(self, local: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return self.family.gather(local, tp_group=self.tp_group, pp_group=self.pp_group, layer_offset=self.layer_offset)

    def export_weights(self) -> dict[str, torch.Tensor]:
        """Whole weights in the family's naming (``TinyCausalLM`` names, or the HF module's
        ``state_dict`` names, which the HF rollout engine and the HF export load). A collective: every
        rank must call it.

        These are the weights the optimizer steps, in float32: with ``--bf16`` the float32 masters,
        not the bfloat16 parameters (like the torch backend, whose float32 parameters are its
        masters). A receiver rounds them once, to its own dtype: a rollout engine when it copies them
        into its model, the Hugging Face export to the base checkpoint's dtype. The bfloat16
        parameters would lose every update below bfloat16's resolution (near 1.0, e.g. a norm
        weight, any change under 2**-9 at the default ``--lr``)."""
        return self._gather({name: tensor.detach() for name, tensor in self._master_tensors().items()})

    def load_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Replace the model weights (the family's naming); optimizer state is kept. With ``--bf16``
        the float32 masters take ``weights`` exactly and the bfloat16 parameters their rounding, as
        after an optimizer step."""
        self._load_weights_into(self.gpt, weights)
        if self.bf16:
            with torch.no_grad():
                self._shard_into(self._master_params(), weights)


    # -- TrainingBackend ---------------------------------------------------------------------

    def compute_log_probs(
        self, batch: TokenBatch, *, with_entropy: bool = False, micro_batch_size: int | None = None
    ) -> TokenLogProbs:
        rows = self._micro_batches(len(batch), micro_batch_size)
        batch = self._on_device(batch)

        def collect(mb, part, logits):
            out = self._token_log_probs(logits, mb, with_entropy)
            return logits.new_zeros(()), {"log_probs": out.log_probs, "entropy": out.entropy}

        self.model.eval()
        with torch.no_grad():
            store = self._run_schedule(batch, rows, collect, forward_only=True)
        self.model.train()
        result = None
        if self.is_last_stage:
            log_probs = torch.cat([s["log_probs"] for s in store])
            entropy = torch.cat([s["entropy"] for s in store]) if with_entropy else None
            result = TokenLogProbs(log_probs=log_probs.float(), entropy=None if entropy is None else entropy.float())
        return self._from_last_stage(result)

    def train_step(
        self, batch: TokenBatch, loss_fn: LossFn, *, micro_batch_size: int | None = None, with_entropy: bool = True
    ) -> dict[str, float]:
        metrics = self.accumulate_gradients(batch, loss_fn, micro_batch_size=micro_batch_size, with_entropy=with_entropy)
        if self.schedule is not None:
            optim.set_learning_rate(self.optimizer, self.schedule.lr(self.steps))
        with _cpu_compat.cpu_device_scope():
            ok, grad_norm, _ = self.optimizer.step()
        if not ok or grad_norm is None or not math.isfinite(grad_norm):
            raise FloatingPointError(
                f"non-finite gradient norm ({grad_norm}) at optimizer step {self.steps + 1}; the step was not "
                "applied. Lower --lr or check the rewards/advantages for extreme values."
            )
        metrics.update(grad_norm=float(grad_norm), lr=self.optimizer.param_groups[0]["lr"])
        self.steps += 1
        return metrics

    def accumulate_gradients(
        self, batch: TokenBatch, loss_fn: LossFn, *, micro_batch_size: int | None = None, with_entropy: bool = True
    ) -> dict[str, float]:
        """Forward/backward over all micro-batches and the DP gradient reduction, without a step.

        ``train_step`` is this plus ``optimizer.step()`` (clipping included). Returns the loss and
        the loss metrics, each summed over micro-batches like ``TorchBackend`` (they are shares of
        the mini-batch, see ``PolicyLossOutput``).
        """
        rows = self._micro_batches(len(batch), micro_batch_size)
        batch = self._on_device(batch)
        # Undo Megatron's mean over micro-batches and (for "sum") DDP's mean over DP ranks.
        scale = len(rows) * (self.dp_size if self.dp_grad_reduction == "sum" else 1)

        def loss_func(mb, part, logits):
            out = loss_fn(self._token_log_probs(logits, mb, with_entropy=with_entropy), part)
            metrics = {k: torch.as_tensor(v).detach().float() for k, v in out.metrics.items()}
            return out.loss * scale, {"__loss": out.loss.detach().float(), **metrics}

        self.model.train()
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()
        store = self._run_schedule(batch, rows, loss_func, forward_only=False)
        metrics = None
        if self.is_last_stage:
            metrics = {k: float(sum(float(s[k]) for s in store)) for k in store[0] if k != "__loss"}
            metrics["loss"] = float(sum(s["__loss"] for s in store))
        return self._from_last_stage(metrics)

    def gradients(self) -> dict[str, torch.Tensor]:
        """The reduced gradients of the last ``accumulate_gradients``/``train_step`` in ``TinyCausalLM``
        naming (after ``train_step`` they are clipped). A collective over tp and pp."""
        grads = {canonical_name(name): p.main_grad for name, p in self.gpt.named_parameters()}
        return self._gather(grads)

    @torch.no_grad()
    def logits(self, batch: TokenBatch) -> torch.Tensor:
        """Full-vocabulary logits ``[N, S, V]`` (gathered over tp). For checks; pipeline size 1 only."""
        if self.pp_size > 1:
            raise NotImplementedError("logits() needs --pipeline-model-parallel-size 1")
        self.model.eval()
        shard = self._forward(self.model, batch)
        self.model.train()
        if self.tp_size > 1:
            parts = [torch.empty_like(shard) for _ in range(self.tp_size)]
            dist.all_gather(parts, shard.contiguous(), group=self.tp_group)
            shard = torch.cat(parts, dim=-1)
        return shard[..., : self.model_config.vocab_size].float()  # bfloat16 with --bf16

