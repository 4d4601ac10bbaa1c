"""``ShardedTorchBackend``: ``TorchBackend`` with ``--sharding fsdp`` (``relax.backends.sharding``).

What differs from the replicated ``TorchBackend``:

- the model is wrapped by ``sharding.shard_model`` before AdamW is built, so the optimizer holds the
  DTensor shards and its state is sharded like them;
- gradients arrive reduce-scattered (summed) from the backward passes: there is no all-reduce, and
  clipping uses the global norm over every rank's shards (``clip_grad_norm_`` on DTensors);
- every rank runs the same number of forward (and backward) passes per call, the missing ones on one
  dummy token with a zero loss (``_idle_pass``), since each pass gathers layers from every rank;
- ``state_dict`` / ``export_weights`` are collectives (``gathers_on_all_ranks``) that hand rank 0 whole
  tensors in the replicated format (with LoRA: the adapter payload of the gathered adapters);
  ``load_state_dict`` cuts each rank's shard out of whole tensors;
- the frozen reference model is sharded the same way (``shard_frozen``) and runs its passes through
  the same lock-step (``frozen_log_probs``).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from relax.backends import optim, sharding
from relax.backends.torch_backend import TorchBackend, _slices, _to_device
from relax.backends.torch_state import check_state
from relax.models import packing
from relax.models.batch import TokenBatch, TokenLogProbs


class ShardedTorchBackend(TorchBackend):
    """See the module docstring; built by ``TorchBackend.for_policy`` with ``--sharding fsdp`` on 2+ ranks."""

    gathers_on_all_ranks = True
    forward_is_collective = True

    def __init__(self, model: nn.Module, *, process_group, bf16: bool = False, **options):
        if process_group is None:
            raise ValueError("--sharding fsdp needs the data-parallel process group (2 or more ranks)")
        model = sharding.shard_model(model, process_group, bf16=bf16)
        super().__init__(model, process_group=process_group, bf16=bf16, **options)

    # -- passes in lock-step ----------------------------------------------------------------------

    def _micro_batches(self, batch: TokenBatch, micro_batch_size: int | None, *, with_entropy: bool, **outputs):
        packed = bool(self.max_tokens_per_micro_batch)
        if len(batch) == 0:
            passes = []
        elif packed:
            batch = _to_device(batch, self.device)
            plan = packing.plan_micro_batches(packing.sample_lengths(batch), self.max_tokens_per_micro_batch)
            self.last_pack_plan = plan
            passes = [torch.tensor(group, dtype=torch.long, device=self.device) for group in plan.groups]
        else:
            passes = _slices(len(batch), micro_batch_size)
        idle = sharding.agreed_passes(len(passes), self.process_group, self.device) - len(passes)
        for rows in passes:
            if packed:
                yield rows, self._forward_packed(batch, rows, with_entropy=with_entropy, **outputs)
            else:
                yield rows, self._forward(batch.select(rows), with_entropy=with_entropy, **outputs)
        for _ in range(idle):
            self._idle_pass()

    def _idle_pass(self) -> None:
        """One pass over a single dummy token, to join the other ranks' gathers (and, in a training step,
        their gradient reduce-scatters, adding zeros: its loss is 0)."""
        one = torch.zeros((1, 1), dtype=torch.long, device=self.device)
        dummy = TokenBatch(prompt_ids=one, prompt_mask=one == 0, response_ids=one, response_mask=one == 0)
        if self.max_tokens_per_micro_batch:  # a training step attends packed over its whole backward
            out = self._forward_packed(dummy, torch.zeros(1, dtype=torch.long, device=self.device), with_entropy=False)
        else:
            out = self._forward(dummy, with_entropy=False)
        if torch.is_grad_enabled():
            (out.log_probs.sum() * 0.0).backward()

    @torch.no_grad()
    def compute_log_probs(self, batch: TokenBatch, *, with_entropy: bool = False,
                          micro_batch_size: int | None = None) -> TokenLogProbs:
        try:
            if len(batch) == 0:  # a rank without rows this step: it still joins every pass
                list(self._micro_batches(batch, micro_batch_size, with_entropy=with_entropy))
                empty = torch.zeros(batch.response_mask.shape, dtype=torch.float32, device=batch.response_mask.device)
                return TokenLogProbs(log_probs=empty, entropy=empty.clone() if with_entropy else None)
            return super().compute_log_probs(batch, with_entropy=with_entropy, micro_batch_size=micro_batch_size)
        finally:
            self.model.reshard()  # the root stays gathered after a forward without backward

    def shard_frozen(self, model: nn.Module) -> nn.Module:
        """The frozen reference model, sharded over the same ranks (float32, like the replicated path's)."""
        return sharding.shard_model(model, self.process_group, bf16=False)

    def frozen_log_probs(self, model: nn.Module, batch: TokenBatch, *, micro_batch_size: int | None) -> torch.Tensor:
        """``[N, T]`` log-probs of a ``shard_frozen`` model, in this backend's micro-batches and lock-step:
        the passes of ``relax.runtime.step.reference_pass`` (same grouping, float32, no autocast)."""
        policy, bf16 = self.model, self.bf16
        self.model, self.bf16 = model, False
        try:
            return self.compute_log_probs(batch, micro_batch_size=micro_batch_size).log_probs
        finally:
            self.model, self.bf16 = policy, bf16

    # -- gradients --------------------------------------------------------------------------------

    def _all_reduce_gradients(self, params: list[torch.Tensor]) -> None:
        """Nothing to do: the backward passes reduce-scattered (summed) every gradient already."""

    # -- state ------------------------------------------------------------------------------------

    @property
    def _keeps(self) -> bool:
        return self.dp_rank == 0

    def state_dict(self) -> dict:
        """Rank 0: whole tensors in ``TorchBackend.state_dict``'s format (the other ranks join, keep nothing)."""
        self.model.reshard()
        return {
            "model": self.export_weights() if self.lora else sharding.gathered(self.model.state_dict().items(),
                                                                               self._keeps),
            "optimizer": sharding.gathered_optimizer_state(self.optimizer, self._keeps),
            "optimizer_param_names": optim.param_names(self.model, self.optimizer),
            "step": self.step,
        }

    def load_state_dict(self, state: Mapping) -> None:
        """Whole tensors (saved with any number of ranks, sharded or not) -> this rank's shards."""
        import copy

        check_state(state)
        self.model.reshard()
        if self.lora:
            from relax.models.hf.lora import load_adapter

            load_adapter(_AdapterView(self.model, {n: _ShardWriter(p) for n, p in self._lora_params()}), state["model"])
            current = {}
        else:
            current = self.model.state_dict()
        absent = sorted(set(current) - set(state["model"]))
        if absent:
            raise KeyError(f"the checkpoint's weights lack {absent[:4]}: was it saved with another model?")
        if current:
            self.model.load_state_dict({name: sharding.local_shard(state["model"][name], like)
                                        for name, like in current.items()})
        names = optim.param_names(self.model, self.optimizer)
        saved_names = state.get("optimizer_param_names") or [n for n, p in self.model.named_parameters()
                                                              if p.requires_grad]
        regrouped = optim.regrouped_state(copy.deepcopy(state["optimizer"]), saved_names, self.optimizer, names)
        self.optimizer.load_state_dict(sharding.sharded_optimizer_state(regrouped, self.optimizer))
        self.step = int(state["step"])

    def export_weights(self) -> dict[str, torch.Tensor]:
        """Rank 0: the whole weights on the CPU, gathered one tensor at a time (a collective); with LoRA
        the adapter payload of the gathered adapters."""
        self.model.reshard()
        if self.lora:
            from relax.models.hf.lora import adapter_payload

            whole = sharding.gathered(self._lora_params(), self._keeps)
            return adapter_payload(_AdapterView(self.model, whole)) if self._keeps else {}
        return sharding.gathered(self.model.state_dict().items(), self._keeps)

    def _lora_params(self) -> list[tuple[str, torch.Tensor]]:
        return [(n, p) for n, p in self.model.named_parameters() if ".lora_" in n]


class _AdapterView:
    """What ``relax.models.hf.lora`` reads of a peft model (its settings and its LoRA parameters), over
    other tensors: the whole ones gathered from the shards, or writers into this rank's shards."""

    def __init__(self, model: nn.Module, params: dict):
        self.peft_config = model.peft_config
        self._params = params

    def named_parameters(self):
        return iter(self._params.items())


class _ShardWriter:
    """``copy_(whole)`` writes this rank's shard of ``whole`` into the sharded parameter."""

    def __init__(self, param: torch.Tensor):
        self.param = param

    def copy_(self, whole: torch.Tensor) -> None:
        self.param.copy_(sharding.local_shard(whole, self.param))
