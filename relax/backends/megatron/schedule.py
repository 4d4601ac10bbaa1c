"""The forward/backward schedule of ``MegatronBackend``: micro-batches, megatron-core's pipeline
schedule or the same arithmetic inline, and the outputs of the last pipeline stage handed to every stage.

A mixin: it runs on the backend's model (``model``, ``config``), its pipeline group (``pp_size``,
``pp_group``, ``is_last_stage``, ``last_stage_rank``) and its forward pass (``_forward``, ``device``).
"""

from __future__ import annotations

import contextlib
from functools import partial

import torch
import torch.distributed as dist

from relax.backends.base import TokenBatch, TokenLogProbs
from relax.backends.megatron import _cpu_compat


class MicroBatchSchedule:
    """Runs the backend's model over a batch's micro-batches (see the module's docstring)."""

    def _micro_batches(self, n: int, micro_batch_size: int | None) -> list[slice]:
        size = micro_batch_size or self.micro_batch_size or n
        if size < 1:
            raise ValueError(f"--micro-batch-size must be >= 1, got {size}")
        if self.pp_size > 1 and n % size:
            raise ValueError(
                f"with --pipeline-model-parallel-size {self.pp_size} every micro-batch must have the same "
                f"size: {n} samples on this rank are not a multiple of --micro-batch-size {size}"
            )
        return [slice(i, min(i + size, n)) for i in range(0, n, size)]

    def _run_schedule(self, batch: TokenBatch, rows: list[slice], loss_func, forward_only: bool) -> list:
        """Forward (and backward) over the micro-batches ``rows``; the loss functions' second outputs.

        Without pipeline parallelism (and the features of :meth:`_unpipelined_applies`) this is
        :meth:`_run_unpipelined`, the same arithmetic as megatron-core's
        ``forward_backward_no_pipelining`` without its per-call bookkeeping. Otherwise it is
        megatron-core's schedule (1F1B with pipeline stages), which also needs the CPU device scope
        (its token counter is a literal CUDA tensor).
        """
        if self._unpipelined_applies():
            return self._run_unpipelined(batch, rows, loss_func, forward_only)
        from megatron.core.pipeline_parallel import get_forward_backward_func

        def forward_step(data_iterator, model):
            part = next(data_iterator)
            mb = batch.select(part)
            return self._forward(model, mb), partial(loss_func, mb, part)

        with _cpu_compat.cpu_device_scope():
            return get_forward_backward_func()(
                forward_step_func=forward_step,
                data_iterator=iter(rows),
                model=[self.model],
                num_microbatches=len(rows),
                seq_length=batch.input_ids.shape[1],
                micro_batch_size=rows[0].stop - rows[0].start,
                forward_only=forward_only,
            )

    def _unpipelined_applies(self) -> bool:
        """Is :meth:`_run_unpipelined` the same computation as Megatron's schedule for this config?
        Anything the inline loop does not reproduce (autocast, loss scaling, per-token loss, MoE or
        MTP loss scaling, FP8, context parallelism, CUDA graphs, activation offloading) keeps the
        schedule."""
        c = self.config
        return (
            self.pp_size == 1
            and not c.enable_autocast
            and c.grad_scale_func is None
            and not c.calculate_per_token_loss
            and c.num_moe_experts is None
            and c.mtp_num_layers is None
            and c.fp8 is None
            and c.context_parallel_size == 1
            and c.cuda_graph_impl == "none"
            and not c.overlap_moe_expert_parallel_comm
            and not c.hybrid_context_parallel
            and not c.fine_grained_activation_offloading
        )

    def _run_unpipelined(self, batch: TokenBatch, rows: list[slice], loss_func, forward_only: bool) -> list:
        """megatron-core 0.16's ``forward_backward_no_pipelining`` for relax's configuration (one
        model chunk, no context parallelism, MoE, MTP, CUDA graphs or timers), op for op, so results
        are bit-identical to it: each micro-batch loss is divided by the number of micro-batches
        before its backward pass, all but the last backward run under DDP's ``no_sync``, then
        ``finalize_model_grads`` reduces over DP. What it leaves out is per-call overhead: the
        process-group lookups, a CUDA token counter, and above all the CPU device scope around the
        model, whose ``TorchFunctionMode`` puts a Python call in front of every tensor operation of
        the forward and backward passes (the model needs no device rewrite: its device lookups go
        through the process-wide ``torch.cuda.current_device`` patch, see ``_cpu_compat``). Measured
        with ``benchmarks/megatron_vs_torch.py``: log-probs went from 1.33x to 1.22x the torch
        backend's time. With pipeline stages the schedule is needed and used as is."""
        store, n = [], len(rows)
        for i, part in enumerate(rows):
            last = i == n - 1
            with contextlib.nullcontext() if forward_only or last else self.model.no_sync():
                mb = batch.select(part)
                output = self._forward(self.model, mb)
                loss, reduced = loss_func(mb, part, output)
                store.append(reduced)
                if not forward_only:
                    torch.autograd.backward(loss / n)
        if not forward_only:
            with _cpu_compat.cpu_device_scope():
                self.config.finalize_model_grads_func([self.model])
        return store

    def _from_last_stage(self, obj):
        """Pipeline: outputs exist on the last stage only; hand them to every stage. Log-probs travel
        as CPU tensors (a pickled CUDA tensor would name the sender's device) and arrive on each
        stage's own device."""
        if self.pp_size == 1:
            return obj
        if isinstance(obj, TokenLogProbs):
            obj = _log_probs_to(obj, "cpu")
        box = [obj if self.is_last_stage else None]
        dist.broadcast_object_list(box, src=self.last_stage_rank, group=self.pp_group)
        received = box[0]
        return _log_probs_to(received, self.device) if isinstance(received, TokenLogProbs) else received


def _log_probs_to(out: TokenLogProbs | None, device) -> TokenLogProbs | None:
    if out is None:
        return None
    return TokenLogProbs(log_probs=out.log_probs.to(device),
                         entropy=None if out.entropy is None else out.entropy.to(device))
