"""The weight route: how the trainer's new weights reach the rollout engines, in one place.

Every move of policy weights into a rollout engine goes through a ``WeightSync``, chosen once for the
run from ``--weight-transport`` (``make_weight_sync``) and handed to every worker (the workers never
build one):

- **training side** (each actor rank, end of ``train_step``): ``export`` asks the backend for the
  whole weights — every rank joins when the backend's weights are sharded
  (``gathers_on_all_ranks``), else rank 0 alone asks — and ``publish`` turns rank 0's weights of
  policy version ``v`` into the *handle* the rollout workers receive;
- **the pipeline** keeps only policy version -> handle (an object reference, passed unresolved to
  the rollout calls that sample with that version, so the weights never pass through the driver);
- **rollout side**: ``receive`` turns a handle back into tensors and hands them to the engine's
  ``load_weights`` (which copies them into its model; a Hugging Face engine merges a LoRA adapter
  payload into its base weights instead);
- **restore**: actor rank 0 publishes the weights it restored (``ActorWorker.publish_weights``), so a
  resumed run loads its rollout engines through the same route as training.

Publishing is an exchange both ends take part in. ``ObjectStoreSync``: one contiguous byte buffer
through Ray's object store (``relax.runtime.weights.weights``), the handle is the buffer; the exchange
needs no meeting. ``CollectiveSync`` (``relax.runtime.weights.collective_sync``): a
``torch.distributed`` broadcast, which every end must enter at once; ``connect`` builds its group at
start-up, and the handle is a ticket naming the version. Both send the weights in the dtype the
rollout engines hold the policy in (``publish_dtype``): a bfloat16 engine is sent bfloat16, half the
bytes of the trainer's float32.
"""

from __future__ import annotations

import abc
import importlib
from collections.abc import Mapping
from typing import Any

import torch

from relax.runtime.weights.weights import PackedWeights, pack_weights


def publish_dtype(config) -> torch.dtype | None:
    """The dtype the run's rollout engines hold the policy in, when it is not the trainer's float32:
    bfloat16 with ``--bf16`` for the vLLM engine, and for the transformers engine on a GPU (on the CPU it
    stays float32). The built-in engine holds the trainer's own dtype: None, sent as exported."""
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
    def publish(self, weights: Mapping[str, torch.Tensor], version: int) -> Any:
        """Rank 0: the handle of ``weights`` (policy ``version``) that the rollout workers will ``receive``."""

    @abc.abstractmethod
    def receive(self, handle: Any, engine) -> None:
        """Rollout worker: load the weights behind ``handle`` into ``engine``."""

    def forget_older(self, version: int) -> None:
        """Rollout worker: no later rollout samples with a version older than ``version`` (a transport
        that keeps received versions may drop them; evaluations may have taken newer ones)."""

    def connect(self, sender, receivers: list, devices: list[str], resolve) -> str | None:
        """Driver, once at start-up: join actor rank 0 (``sender``) and the rollout workers
        (``receivers``) when the transport needs a group; returns a line for the run's log, or None."""
        return None

    def open(self) -> str | None:
        """Actor rank 0, in ``connect``: host the group's rendezvous."""
        return None

    def join(self, group, rank: int) -> None:
        """Every end, in ``connect``: enter the group as ``rank`` (actor rank 0 is 0)."""


class ObjectStoreSync(WeightSync):
    """Packed bytes through Ray's object store: one numpy buffer travels zero-copy, bit for bit.

    ``dtype``: the floating-point weights are cast to it before they travel (None: as exported). A
    LoRA adapter payload (``relax.models.hf.lora``) travels as exported: it is small, and the engine
    merges it into its base weights in float32 before casting."""

    def __init__(self, dtype: torch.dtype | None = None):
        self.dtype = dtype

    def publish(self, weights: Mapping[str, torch.Tensor], version: int = 0) -> PackedWeights:
        return pack_weights(in_dtype(weights, self.dtype))

    def receive(self, handle, engine) -> None:
        # A plain mapping is accepted as well: in-process callers (tests, recipes) pass the
        # backend's export directly.
        engine.load_weights(handle.unpack() if isinstance(handle, PackedWeights) else handle)



# --weight-transport -> the class (module:Class, imported when chosen)
TRANSPORTS = {
    "object-store": "relax.runtime.weights.weight_sync:ObjectStoreSync",
    "collective": "relax.runtime.weights.collective_sync:CollectiveSync",
}


def make_weight_sync(config) -> WeightSync:
    """The run's transport (``--weight-transport``), sending in the engines' dtype; built once by
    whoever starts the workers and handed to each of them."""
    module, name = TRANSPORTS[config.weight_transport].split(":")
    return getattr(importlib.import_module(module), name)(publish_dtype(config))


class JoinsWeightGroup:
    """The Ray methods of a worker holding the run's ``weight_sync`` (``WeightSync.connect`` calls them)."""

    def open_weight_group(self) -> str | None:
        return self.weight_sync.open()

    def join_weight_group(self, group, rank: int) -> bool:
        self.weight_sync.join(group, rank)
        return True
