"""The Megatron backend on a Hugging Face checkpoint and its torch-backend reference, for
``test_megatron_hf_backend.py``. The rank functions are module level (spawn pickles them by name);
the torch reference runs in the test process (it needs no Megatron state).

Both sides start from the same checkpoint directory, see the same batch and the same "rollout"
log-probs, and run the same GRPO steps, so any difference is the backends' own.
"""

from __future__ import annotations

import torch

from megatron_workers import ADAM_EPS, LR, STEPS, advantages_for, make_loss_fn
from relax.models.batch import TokenBatch

MICRO = 4  # two equal micro-batches of the 8 rows (pipeline parallelism needs equal ones)


def make_batch(vocab: int, n: int = 8, p: int = 5, t: int = 7, seed: int = 2) -> TokenBatch:
    """Left-padded prompts and right-padded responses of different lengths, ids below ``vocab``."""
    g = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(3, vocab, (n, p), generator=g)
    response_ids = torch.randint(3, vocab, (n, t), generator=g)
    prompt_len = torch.randint(1, p + 1, (n,), generator=g)
    response_len = torch.randint(1, t + 1, (n,), generator=g)
    prompt_mask = torch.arange(p)[None, :] >= (p - prompt_len)[:, None]
    response_mask = torch.arange(t)[None, :] < response_len[:, None]
    return TokenBatch(prompt_ids=prompt_ids.masked_fill(~prompt_mask, 0), prompt_mask=prompt_mask,
                      response_ids=response_ids.masked_fill(~response_mask, 0), response_mask=response_mask)


def rollout_log_probs(first: torch.Tensor, batch: TokenBatch) -> torch.Tensor:
    """The "rollout" log-probs both backends train against: the torch backend's, perturbed so the
    importance ratio is not 1 and clipping engages."""
    return first + 0.3 * advantages_for(batch, seed=4)


def train(backend, batch: TokenBatch, old: torch.Tensor) -> list[dict]:
    loss_fn = make_loss_fn(batch, old, advantages_for(batch), float(batch.response_mask.sum()))
    return [backend.train_step(batch, loss_fn, micro_batch_size=MICRO) for _ in range(STEPS)]


def run_config(checkpoint: str, tp: int = 1, pp: int = 1):
    """The ``RunConfig`` a ``relax train --backend megatron --hf-checkpoint`` run hands ``for_policy``."""
    from relax.config.run import RunConfig

    return RunConfig(backend="megatron", hf_checkpoint=checkpoint, lr=LR, adam_eps=ADAM_EPS, clip_grad=1.0,
                     seed=7, tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)


def torch_reference(checkpoint: str, vocab: int) -> dict:
    """The torch backend on the checkpoint: log-probs, entropy, ``STEPS`` GRPO steps, trained weights."""
    from relax.backends.torch_backend import TorchBackend
    from relax.models.factory import build_policy_model

    config = run_config(checkpoint)
    model = build_policy_model(config, device="cpu")
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    backend = TorchBackend.for_policy(config, model)
    batch = make_batch(vocab)
    first = backend.compute_log_probs(batch, with_entropy=True)
    old = rollout_log_probs(first.log_probs, batch)
    metrics = train(backend, batch, old)
    return {"initial": initial, "log_probs": first.log_probs, "entropy": first.entropy, "old": old,
            "metrics": metrics, "trained": backend.export_weights()}


def _megatron(checkpoint: str, tp: int, pp: int):
    from relax.backends.megatron.backend import MegatronBackend
    from relax.models.factory import build_policy_model

    config = run_config(checkpoint, tp, pp)
    model = build_policy_model(config, device="cpu")
    backend = MegatronBackend.for_policy(config, model)
    return backend, all(p.is_meta for p in model.parameters())


def _layout_run(checkpoint: str, vocab: int, old: torch.Tensor, tp: int, pp: int) -> dict:
    backend, released = _megatron(checkpoint, tp, pp)
    batch = make_batch(vocab)
    out = {"sizes": (backend.tp_size, backend.pp_size, backend.dp_size), "released": released,
           "exported_initial": backend.export_weights()}
    first = backend.compute_log_probs(batch, with_entropy=True)
    out.update(log_probs=first.log_probs, entropy=first.entropy, metrics=train(backend, batch, old))
    out["trained"] = backend.export_weights()
    out["state"] = backend.state_dict()
    return out, backend


def _reset_parallel_state() -> None:
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()


def single_rank(rank: int, world: int, checkpoint: str, vocab: int, old: torch.Tensor) -> dict:
    """TP = PP = 1: the layout-free reference of the Megatron side."""
    out, _ = _layout_run(checkpoint, vocab, old, 1, 1)
    return out


def two_ranks(rank: int, world: int, checkpoint: str, vocab: int, old: torch.Tensor, tp1_state: dict) -> dict:
    """TP = 2, then PP = 2, on two gloo ranks. After the TP = 2 run, the TP = 1 checkpoint is loaded:
    its state is in HF naming, so it must come back out of the TP = 2 shards unchanged."""
    tp2, backend = _layout_run(checkpoint, vocab, old, 2, 1)
    backend.load_state_dict(tp1_state)
    tp2["reloaded"] = backend.state_dict()
    del backend
    _reset_parallel_state()
    pp2, backend = _layout_run(checkpoint, vocab, old, 1, 2)
    del backend
    return {"tp2": tp2, "pp2": pp2}
