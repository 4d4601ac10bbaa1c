"""``--sharding fsdp``: the torch backend's weights, gradients and Adam state sharded over the data-parallel
ranks with FSDP2 (``torch.distributed.fsdp.fully_shard``), each rank holding 1/N of them.

What this module answers (``relax.backends.sharded_backend`` trains with it):

- **which modules to shard**: the repeated decoder layers (``decoder_layers``: the longest
  ``nn.ModuleList`` of one layer type, e.g. ``TinyCausalLM.blocks`` or a transformers model's
  ``model.layers``) each get their own FSDP unit, and the root takes what is left (embeddings, final
  norm, head). A forward all-gathers one layer at a time and frees it after use (the root stays
  gathered from its first forward until ``reshard``), a backward reduce-scatters each layer's gradient;
- **the gradient reduction**: a plain sum (no division by the number of ranks): the loss is already
  divided by the whole mini-batch's token / sequence counts, so the summed gradient is the whole
  batch's, as in the replicated path's all-reduce;
- **mixed precision** (``--bf16``): parameters gathered in bfloat16 for the compute, gradients reduced
  in float32, the sharded masters and the Adam state float32;
- **collectives on every rank**: every forward is a collective (it gathers layers), so every rank must
  run the same number of passes; ``agreed_passes`` gives the most any rank runs, and a rank with fewer
  real micro-batches fills up with passes over one dummy token whose loss is 0;
- **whole tensors out** (``gathered``): publishing weights and saving checkpoints gather one tensor at
  a time (the tensors' order is the same on every rank); rank 0 keeps a CPU copy of each and the device
  never holds more than one whole tensor beyond its shards. A checkpoint therefore holds whole tensors,
  the format of the replicated path: it resumes with any number of ranks, sharded or not;
- **validation** (``config_errors``): what cannot be sharded is refused before any worker starts.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn

from relax.config.run import RunConfig
from relax.importing import load_attribute

FSDP = "fsdp"
# --sharding mode -> the backend class that trains with it, by name like the backend registry: the class
# derives from TorchBackend, whose for_policy picks it, so an import here would close a circle.
SHARDED_BACKENDS = {FSDP: "relax.backends.sharded_backend:ShardedTorchBackend"}


def sharded_backend_class(mode: str):
    """The ``TorchBackend`` subclass that trains with ``--sharding mode`` (not ``none``)."""
    return load_attribute(SHARDED_BACKENDS[mode], "--sharding")


def decoder_layers(model: nn.Module) -> nn.ModuleList | None:
    """The model's repeated decoder layers: of the ``nn.ModuleList`` children whose items all share one
    type and hold parameters, the one holding the most parameters (None: no such list)."""
    best, best_size = None, 0
    for module in model.modules():
        if not isinstance(module, nn.ModuleList) or len(module) == 0:
            continue
        if len({type(layer) for layer in module}) != 1:
            continue
        size = sum(p.numel() for p in module.parameters())
        if size > best_size:
            best, best_size = module, size
    return best


def config_errors(config: RunConfig) -> list[str]:
    """``--sharding fsdp`` checks of the torch backend (the registry refuses it for other backends)."""
    if config.sharding != FSDP:
        return []
    errors = []
    if config.actor_num_workers < 2:
        errors.append(f"--sharding fsdp shards over the data-parallel ranks, and --actor-num-workers "
                      f"{config.actor_num_workers} gives one: pass --actor-num-workers 2 or more, or drop --sharding")
    if config.hf_checkpoint:
        missing = _hf_without_layers(config.hf_checkpoint)
        if missing:
            errors.append(f"--sharding fsdp: {missing}; drop --sharding to train it replicated")
    return errors


def _hf_without_layers(path: str) -> str | None:
    """Why the checkpoint's model has no decoder layers to shard (built on the meta device: no memory,
    no weights read), or None. A checkpoint that cannot be read is left to the loading checks."""
    try:
        from transformers import AutoConfig, AutoModelForCausalLM

        hf_config = AutoConfig.from_pretrained(path)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(hf_config)
    except Exception:  # noqa: BLE001 - an unreadable checkpoint is reported by --hf-checkpoint's own checks
        return None
    if decoder_layers(model) is None:
        return (f"{type(model).__name__} ({path}) has no list of repeated decoder layers to shard one by one "
                "(an nn.ModuleList of one layer type)")
    return None


def mesh_of(group: dist.ProcessGroup, device: torch.device):
    """The one-dimensional device mesh of the data-parallel ``group`` on ``device``'s type."""
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh.from_group(group, device_type=device.type)


def shard_model(model: nn.Module, group: dist.ProcessGroup, *, bf16: bool) -> nn.Module:
    """``model`` with each decoder layer and the root wrapped by ``fully_shard`` over ``group`` (in place;
    the same object, now an ``FSDPModule``). Its parameters become DTensors holding this rank's shard."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

    layers = decoder_layers(model)
    if layers is None:
        raise ValueError(f"--sharding fsdp: {type(model).__name__} has no list of repeated decoder layers to shard")
    device = next(model.parameters()).device
    options = {"mesh": mesh_of(group, device)}
    if bf16:  # bfloat16 compute over float32 masters; gradients summed in float32
        options["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in layers:
        fully_shard(layer, **options)
    fully_shard(model, **options)
    # The built-in model's packed forward and a critic's trunk call hidden_states, not forward: it must
    # gather the root's parameters too.
    if hasattr(model, "hidden_states"):
        register_fsdp_forward_method(model, "hidden_states")
    for unit in [*layers, model]:
        # Sum the ranks' gradients (the loss is normalized by whole-batch counts): no 1/N factor, and
        # a plain SUM collective, which gloo has too (a pre-scaled sum is NCCL-only).
        unit.set_gradient_divide_factor(1.0)
        unit.set_force_sum_reduction_for_comms(True)
    return model


def agreed_passes(local: int, group: dist.ProcessGroup, device: torch.device) -> int:
    """The most forward passes any rank of ``group`` has to run (each rank runs that many)."""
    count = torch.tensor([local], dtype=torch.long, device=device)
    dist.all_reduce(count, op=dist.ReduceOp.MAX, group=group)
    return int(count)


def _full(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def gathered(tensors: Iterable[tuple], keep: bool) -> dict:
    """``{name: whole tensor on the CPU}`` of ``(name, tensor)`` pairs, gathered one tensor at a time
    (a collective: every rank iterates the same pairs); ``keep`` False (ranks > 0): joins, keeps nothing."""
    out = {}
    for name, tensor in tensors:
        whole = _full(tensor.detach())
        if keep:
            out[name] = whole.to("cpu", copy=True)
        del whole  # free the gathered tensor before the next one
    return out


def gathered_optimizer_state(optimizer: torch.optim.Optimizer, keep: bool) -> dict:
    """The optimizer's ``state_dict`` with whole state tensors (the replicated path's format)."""
    import copy

    saved = optimizer.state_dict()
    state = {index: gathered(saved["state"][index].items(), keep) for index in sorted(saved["state"])}
    return {"state": state, "param_groups": copy.deepcopy(saved["param_groups"])}


def local_shard(whole: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """This rank's shard of ``whole``, laid out like the DTensor ``like`` (a plain ``like``: ``whole`` on its
    device). Every rank holds ``whole``, so each cuts its own piece without communication."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if not isinstance(like, DTensor):
        return whole.to(device=like.device, dtype=like.dtype)
    whole = whole.to(device=like.device, dtype=like.dtype)
    return distribute_tensor(whole, like.device_mesh, like.placements, src_data_rank=None)


def sharded_optimizer_state(state: dict, optimizer: torch.optim.Optimizer) -> dict:
    """A whole-tensor optimizer ``state_dict`` (in ``optimizer``'s parameter order) with each per-parameter
    tensor of a parameter's shape cut to this rank's shard of that parameter."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for index, per_param in state["state"].items():
        param = params[index]
        for key, value in per_param.items():
            if isinstance(value, torch.Tensor) and value.shape == param.shape and value.dim() > 0:
                per_param[key] = local_shard(value, param)
    return state
