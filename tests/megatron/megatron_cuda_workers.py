"""Rank functions for the GPU tests of ``test_megatron_cuda`` (run only where CUDA is available).

Each returns CPU tensors and plain values; the assertions live in the test module.
"""

from __future__ import annotations

import io

import torch

import megatron_workers as W
from relax.algorithms.types import PolicyLossInputs
from relax.models.tiny.model import TinyCausalLM


def _devices(tensors) -> set[str]:
    return {t.device.type for t in tensors}


def _loss_fn(batch, old_log_probs, advantages, global_num_tokens: float):
    """``megatron_workers.make_loss_fn`` with its tensors taken to the log-probs' device."""

    def loss_fn(token_log_probs, rows):
        device = token_log_probs.log_probs.device
        return W.ALGORITHM.policy_loss(
            PolicyLossInputs(
                log_probs=token_log_probs.log_probs,
                old_log_probs=old_log_probs[rows].to(device),
                advantages=advantages[rows].to(device),
                response_mask=batch.response_mask[rows].to(device),
                entropy=token_log_probs.entropy,
                global_num_tokens=global_num_tokens,
            )
        )

    return loss_fn


def _train(backend, batch) -> dict:
    first = backend.compute_log_probs(batch, with_entropy=True)  # a CPU batch in, as the actor reads it
    old = first.log_probs.cpu() + 0.3 * W.advantages_for(batch, seed=4)
    loss_fn = _loss_fn(batch, old, W.advantages_for(batch), float(batch.response_mask.sum()))
    metrics = [backend.train_step(batch, loss_fn, micro_batch_size=W.MICRO) for _ in range(W.STEPS)]
    return {"log_probs_device": first.log_probs.device.type, "log_probs": first.log_probs.cpu(),
            "entropy": first.entropy.cpu(), "metrics": metrics, "loss_fn": loss_fn}


def trains_on_the_gpu(rank: int, world: int) -> dict:
    """World 1 on NCCL: the Megatron backend in float32 and in bf16 on the GPU, against the torch
    backend's float32 run of the same model, batch and loss."""
    from relax.backends.megatron import _cpu_compat
    from relax.backends.torch_backend import TorchBackend

    batch = W.make_batch()
    reference = TinyCausalLM(W.CFG)
    reference.load_state_dict(W.initial_weights())
    # the reference: the torch backend on the same model, batch and loss (float32)
    torch_run = _train(TorchBackend(reference, lr=W.LR, eps=W.ADAM_EPS, clip_grad=1.0), batch)
    torch_run.pop("loss_fn")
    out = {"torch": torch_run}
    for precision in ("fp32", "bf16"):
        mg = W._megatron(bf16=precision == "bf16")
        run = {
            "device": str(mg.device),
            "current_device": torch.cuda.current_device(),
            "compat_applied": _cpu_compat.is_applied(),
            "param_devices": _devices(mg.gpt.parameters()),
            "param_dtypes": {p.dtype for p in mg.gpt.parameters()},
            "master_devices": _devices(mg._master_params().values()),
        }
        run.update(_train(mg, batch))
        loss_fn = run.pop("loss_fn")
        exported = mg.export_weights()
        run["exported"] = exported
        run["exported_devices"] = _devices(exported.values())
        state = mg.state_dict()
        run["state_devices"] = _devices([state["model"][k] for k in state["model"]]
                                        + [state["exp_avg"][k] for k in state["exp_avg"]])
        # a checkpoint round trip as the runtime does it: saved, read back onto the CPU, restored
        buffer = io.BytesIO()
        torch.save(state, buffer)
        buffer.seek(0)
        restored = torch.load(buffer, map_location="cpu", weights_only=False)
        run["next_step"] = mg.train_step(batch, loss_fn, micro_batch_size=W.MICRO)
        run["after_next"] = mg.export_weights()
        mg.load_state_dict(restored)
        run["resumed_step"] = mg.train_step(batch, loss_fn, micro_batch_size=W.MICRO)
        run["after_resumed"] = mg.export_weights()
        run["peak_memory_bytes"] = torch.cuda.max_memory_allocated()
        out[precision] = run
        del mg
    return out
