"""The weight route: how the trainer's new weights reach the rollout engines, in one place.

Every move of policy weights into a rollout engine goes through a ``WeightSync``:

- **training side** (each actor rank, end of ``train_step``): ``export`` asks the backend for the
  whole weights — every rank joins when the backend's weights are sharded
  (``gathers_on_all_ranks``), else rank 0 alone asks — and ``publish`` turns rank 0's weights into
  the *handle* the rollout workers receive;
- **the pipeline** keeps only policy version -> handle (an object reference, passed unresolved to
  the rollout calls that sample with that version, so the weights never pass through the driver);
- **rollout side**: ``receive`` turns a handle back into tensors and hands them to the engine's
  ``load_weights`` (which copies them into its model; a Hugging Face engine merges a LoRA adapter
  payload into its base weights instead);
- **restore**: ``from_checkpoint`` makes the same kind of handle from a saved backend state, so a
  resumed run loads its rollout engines exactly as training does.

``ObjectStoreSync`` is the transport of today: one contiguous byte buffer through Ray's object
store (``relax.runtime.weights``), in the dtype the rollout engines hold the policy in
(``publish_dtype``): a bfloat16 engine is sent bfloat16, half the bytes of the trainer's float32. A second transport — an NCCL broadcast or CUDA IPC into a GPU
engine — is a second ``WeightSync`` class; actor, pipeline and rollout worker do not change.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any

import torch

from relax.runtime.weights import PackedWeights, pack_weights


def publish_dtype(config) -> torch.dtype | None:
    """The dtype the run's rollout engines hold the policy in, when it is not the trainer's float32:
    the vLLM engine's (bfloat16 with ``--bf16``). The transformers engine loads float32 (its log-probs
    must match the trainer's) and the built-in engine the trainer's own dtype: None, sent as exported."""
    from relax.rollout.engines import run_engine

    engine_dtype = run_engine(config).weights_dtype(config)  # the engine's own rule (relax.rollout.registry)
    if engine_dtype is None:
        return None
    from relax.models.hf.loading import resolve_dtype

    dtype = resolve_dtype(engine_dtype)
    return None if dtype == torch.float32 else dtype


def in_dtype(weights: Mapping[str, torch.Tensor], dtype: torch.dtype | None) -> Mapping[str, torch.Tensor]:
    """``weights`` with every floating-point tensor cast to ``dtype`` (None, or a LoRA adapter payload:
    ``weights`` unchanged)."""
    from relax.models.hf.lora import is_adapter_payload

    if dtype is None or is_adapter_payload(weights):
        return weights
    return {name: t.to(dtype) if t.is_floating_point() else t for name, t in weights.items()}


class WeightSync(abc.ABC):
    """One transport of policy weights from the training ranks to the rollout engines."""

    def export(self, backend, rank: int) -> Mapping[str, torch.Tensor] | None:
        """The backend's whole weights on rank 0 (None on the other ranks, which still join the
        gather when the backend's weights are sharded over ranks)."""
        if backend.gathers_on_all_ranks or rank == 0:
            weights = backend.export_weights()
            return weights if rank == 0 else None
        return None

    @abc.abstractmethod
    def publish(self, weights: Mapping[str, torch.Tensor]) -> Any:
        """Rank 0: the handle of ``weights`` that the rollout workers will ``receive``."""

    @abc.abstractmethod
    def receive(self, handle: Any, engine) -> None:
        """Rollout worker: load the weights behind ``handle`` into ``engine``."""

    def from_checkpoint(self, backend_cls, backend_state: Mapping) -> Any:
        """The handle of the weights in a saved backend state (``TrainingBackend.state_dict``)."""
        return self.publish(backend_cls.weights_in_state(backend_state))


class ObjectStoreSync(WeightSync):
    """Packed bytes through Ray's object store: one numpy buffer travels zero-copy, bit for bit.

    ``dtype``: the floating-point weights are cast to it before they travel (None: as exported). A
    LoRA adapter payload (``relax.models.hf.lora``) travels as exported: it is small, and the engine
    merges it into its base weights in float32 before casting."""

    def __init__(self, dtype: torch.dtype | None = None):
        self.dtype = dtype

    def publish(self, weights: Mapping[str, torch.Tensor]) -> PackedWeights:
        return pack_weights(in_dtype(weights, self.dtype))

    def receive(self, handle, engine) -> None:
        # A plain mapping is accepted as well: in-process callers (tests, recipes) pass the
        # backend's export directly.
        engine.load_weights(handle.unpack() if isinstance(handle, PackedWeights) else handle)

