"""Rank functions for ``test_megatron_device``: the Megatron backend with its model on a device other
than the CPU, emulated on a CPU-only machine with torch's ``meta`` device (shapes, dtypes and
devices, no values). Any tensor the backend leaves on the CPU meets the model's ``meta`` tensors and
torch refuses the operation, as CUDA refuses a CPU tensor beside a GPU one.
"""

from __future__ import annotations

import torch

import megatron_workers as W

META = torch.device("meta")


def _placement(tensor: torch.Tensor | None) -> tuple | None:
    return None if tensor is None else (str(tensor.device), tensor.dtype, tuple(tensor.shape))


def passes_beside_the_model(rank: int, world: int) -> dict:
    """Log-probs through the backend's own schedule with its model moved off the CPU; the backend
    built on a rank whose device is not the CPU; a forward and backward of the backend's GPTModel
    (float32, and bfloat16 under Float16Module) on that device, fed by the backend's input and
    log-prob code from a CPU batch."""
    from megatron.core.transformer.module import Float16Module

    from relax.backends.megatron import _cpu_compat

    batch = W.make_batch()
    out: dict = {}

    mg = W._megatron()
    out["cpu_log_probs"] = _placement(mg.compute_log_probs(batch, with_entropy=True).log_probs)
    mg.model.module.to(META)  # the GPTModel inside Megatron's DDP wrapper, as it sits on a GPU
    moved = mg.compute_log_probs(batch, with_entropy=True)
    out["log_probs"] = _placement(moved.log_probs)
    out["entropy"] = _placement(moved.entropy)
    del mg

    # The rank's device, as placement.training_device() would give a GPU rank: the backend must
    # build its model, DDP and optimizer there (the CPU patches stay: this machine has no CUDA).
    from relax.backends.megatron import placement

    _cpu_compat.apply()
    chosen = placement.training_device
    placement.training_device = lambda: META
    try:
        for bf16 in (False, True):
            mg = W._megatron(bf16=bf16)
            built = mg.compute_log_probs(batch, with_entropy=True)
            out["built_bf16" if bf16 else "built_fp32"] = {
                "device": str(mg.device),
                "params": {name: _placement(p) for name, p in mg.gpt.named_parameters()},
                "masters": {name: _placement(m) for name, m in mg._master_params().items()},
                "log_probs": _placement(built.log_probs),
            }
            del mg
    finally:
        placement.training_device = chosen

    for bf16 in (False, True):
        mg = W._megatron(bf16=bf16)
        with _cpu_compat.cpu_device_scope():
            gpt = mg.family.build(mg.config, pre_process=True, post_process=True)
        gpt.to(META)
        model = Float16Module(mg.config, gpt) if bf16 else gpt
        logits = mg._forward(model, batch)
        tokens = mg._token_log_probs(logits, batch, with_entropy=True)
        advantages = W.advantages_for(batch).to(tokens.log_probs.device)
        loss = -(tokens.log_probs * advantages).sum() - 0.01 * tokens.entropy.sum()
        loss.backward()
        out["bf16" if bf16 else "fp32"] = {
            "logits": _placement(logits),
            "log_probs": _placement(tokens.log_probs),
            "loss": _placement(loss),
            "params": {name: _placement(p) for name, p in gpt.named_parameters()},
            "grads": {name: _placement(p.grad) for name, p in gpt.named_parameters()},
        }
        del mg
    return out
