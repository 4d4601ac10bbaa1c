"""Rank function for ``test_megatron_bf16.py`` (module level, so spawn can pickle it): ``--bf16`` on the
Megatron backend against the float32 Megatron backend and the torch backend's ``--bf16``.

One spawned process runs every configuration (each spawn pays ~5 s of imports); the assertions live
in the test module.
"""

from __future__ import annotations

import megatron_workers as W
import torch

from relax.backends.megatron.model import local_tensors
from relax.models.tiny.model import TinyCausalLM


def _tiny_model() -> TinyCausalLM:
    model = TinyCausalLM(W.CFG)
    model.load_state_dict(W.initial_weights())
    return model


def bf16_runs(rank: int, world: int) -> dict:
    from relax.backends.megatron.backend import MegatronBackend
    from relax.backends.torch_backend import TorchBackend
    from relax.config.run import RunConfig

    batch = W.make_batch()
    out = {}

    # -- float32 reference ---------------------------------------------------------------------
    fp32 = W._megatron()
    out["inline_schedule"] = [fp32._unpipelined_applies()]
    out["fp32"] = W.run_training(fp32, batch)
    out["fp32_trained"] = fp32.export_weights()
    del fp32

    # -- bf16, built by for_policy from a RunConfig as `relax train --bf16` builds it ----------
    config = RunConfig(lr=W.LR, adam_eps=W.ADAM_EPS, clip_grad=1.0, seed=7, bf16=True)
    mg = MegatronBackend.for_policy(config, _tiny_model())
    params = dict(mg.gpt.named_parameters())
    masters = mg._master_params()
    out["param_dtypes"] = {name: p.dtype for name, p in params.items()}
    out["master_dtypes"] = {name: m.dtype for name, m in masters.items()}
    out["initial_masters"] = mg._gather({k: v.detach().clone() for k, v in masters.items()})
    out["initial_params"] = mg._gather(local_tensors(mg.gpt))
    out["logits_dtype"] = mg.logits(batch).dtype
    out["inline_schedule"].append(mg._unpipelined_applies())
    out["bf16"] = W.run_training(mg, batch)
    masters = mg._master_params()
    out["params_equal_rounded_masters"] = all(
        torch.equal(p, masters[name].to(p.dtype)) for name, p in mg.gpt.named_parameters()
    )
    out["main_grad_dtypes"] = {p.main_grad.dtype for p in mg.gpt.parameters()}
    out["optimizer_param_dtypes"] = {
        p.dtype for opt in mg._torch_optimizers() for g in opt.param_groups for p in g["params"]
    }
    out["adam_state_dtypes"] = {
        v.dtype for opt in mg._torch_optimizers() for s in opt.state.values()
        for k, v in s.items() if k != "step"
    }
    out["adam_exp_avg"] = mg._gather(mg._adam_state("exp_avg"))
    out["bf16_masters"] = mg._gather({k: v.detach().clone() for k, v in masters.items()})
    out["bf16_params"] = mg._gather(local_tensors(mg.gpt))
    out["bf16_exported"] = mg.export_weights()
    out["rollout"] = _published_to_engines(mg)
    del mg

    # -- the torch backend's --bf16 (autocast over float32 weights) on the same model and batch --
    pt = TorchBackend.for_policy(config, _tiny_model())
    out["torch_bf16"] = W.run_training(pt, batch)
    out["torch_bf16_trained"] = pt.export_weights()

    # -- bf16 with --recompute-activations ----------------------------------------------------
    with W.counting_recomputed_forwards() as calls:
        recompute = MegatronBackend.for_policy(
            RunConfig(lr=W.LR, adam_eps=W.ADAM_EPS, clip_grad=1.0, seed=7, bf16=True,
                      recompute_activations=True),
            _tiny_model(),
        )
        out["recompute"] = W.run_training(recompute, batch)
        out["recompute_masters"] = recompute._gather(
            {k: v.detach().clone() for k, v in recompute._master_params().items()}
        )
    out["checkpointed_calls"] = len(calls)
    return out


def _published_to_engines(backend) -> dict:
    """The weights a rollout engine holds after the trainer's publish, as ``relax train`` moves them
    (``ObjectStoreSync``: export, pack, unpack, ``load_weights``), into a float32 and a bfloat16 engine."""
    from relax.rollout.tiny.engine import TinyEngine
    from relax.runtime.weights.weight_sync import ObjectStoreSync

    sync = ObjectStoreSync()
    handle = sync.publish(sync.export(backend, rank=0))
    engines = {"float32": TinyEngine(_tiny_model()), "bfloat16": TinyEngine(_tiny_model().bfloat16())}
    for engine in engines.values():
        sync.receive(handle, engine)
    return {dtype: {k: v.clone() for k, v in engine.model.state_dict().items()} for dtype, engine in engines.items()}


def bf16_two_ranks(rank: int, world: int) -> dict:
    """World 2: ``--bf16`` with TP=2 (bfloat16 partial sums all-reduced) and with PP=2 (bfloat16
    activations sent between stages); log-probs and a few steps each."""
    batch = W.make_batch()
    out = {}
    backend = W._megatron(tensor_model_parallel_size=2, bf16=True)
    out["tp2"] = W.run_training(backend, batch)
    out["tp2_masters"] = backend._gather({k: v.detach().clone() for k, v in backend._master_params().items()})
    out["tp2_exported"] = backend.export_weights()
    del backend
    W._reset_parallel_state()
    backend = W._megatron(pipeline_model_parallel_size=2, bf16=True)
    out["pp2"] = W.run_training(backend, batch, micro=2)
    out["pp2_masters"] = backend._gather({k: v.detach().clone() for k, v in backend._master_params().items()})
    out["pp2_exported"] = backend.export_weights()  # the tied output layer's copy lives on the last stage
    out["pp2_param_dtypes"] = {p.dtype for p in backend.gpt.parameters()}
    return out


def bf16_resume(rank: int, world: int) -> dict:
    """``--bf16`` checkpoint round trip: two steps, ``state_dict``, a fresh bf16 backend loads it and
    takes a third step, against three steps in one go (same batch and loss each step)."""
    batch = W.make_batch()
    reference = W._megatron(bf16=True)
    old = reference.compute_log_probs(batch).log_probs + 0.3 * W.advantages_for(batch, seed=4)
    loss_fn = W.make_loss_fn(batch, old, W.advantages_for(batch), float(batch.response_mask.sum()))

    def snapshot(backend) -> dict:
        return {"params": backend._gather(local_tensors(backend.gpt)),
                "masters": backend._gather({k: v.detach().clone() for k, v in backend._master_params().items()}),
                "exp_avg_sq": backend._gather(backend._adam_state("exp_avg_sq")), "steps": backend.steps}

    straight = [reference.train_step(batch, loss_fn, micro_batch_size=W.MICRO) for _ in range(3)]
    out = {"straight": snapshot(reference), "straight_metrics": straight[-1]}
    del reference
    first = W._megatron(bf16=True)
    for _ in range(2):
        first.train_step(batch, loss_fn, micro_batch_size=W.MICRO)
    state = first.state_dict()
    out["state_dtypes"] = {part: {v.dtype for v in state[part].values()} for part in ("model", "master") if part in state}
    del first
    resumed = W._megatron(bf16=True)
    resumed.load_state_dict(state)
    out["resumed_metrics"] = resumed.train_step(batch, loss_fn, micro_batch_size=W.MICRO)
    out["resumed"] = snapshot(resumed)
    del resumed
    # a checkpoint of the earlier layout: bfloat16 "model" weights, the float32 masters as "master"
    legacy = dict(state, model={k: v.bfloat16() for k, v in state["model"].items()}, master=state["model"])
    from_legacy = W._megatron(bf16=True)
    from_legacy.load_state_dict(legacy)
    from_legacy.train_step(batch, loss_fn, micro_batch_size=W.MICRO)
    out["from_legacy"] = snapshot(from_legacy)
    return out
