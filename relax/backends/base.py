"""The training-backend interface (torch today, megatron behind the same interface).

Batches are ``relax.models.batch.TokenBatch`` (prompts left-padded, responses right-padded).
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from typing import ClassVar

import torch
from torch import nn

from relax.algorithms.types import PolicyLossOutput
from relax.models.batch import TokenBatch, TokenLogProbs, TokenValues

# loss_fn(token_log_probs, rows) -> PolicyLossOutput. ``rows`` are the batch rows of this
# micro-batch, so the caller can index its advantages / old log-probs the same way: a slice, or with
# token-budget micro-batches (``packs_micro_batches``) an int64 tensor of row indices.
LossFn = Callable[[TokenLogProbs | TokenValues, slice | torch.Tensor], PolicyLossOutput]


class TrainingBackend(abc.ABC):
    """One training rank's model + optimizer, and its place in the data-parallel layout.

    The runtime gets a backend class from ``relax.backends.registry.get_backend(config.backend)``
    and never branches on its name: everything that differs between backends is answered here.

    Class-level facts:

    - ``name``: the ``--backend`` value;
    - ``gathers_on_all_ranks``: ``state_dict`` / ``export_weights`` are collectives that every rank
      must join (weights sharded over ranks), else rank 0 alone holds the whole model;
    - ``supports_critic``: ``for_critic`` can build a value-head backend (PPO's critic).
    - ``packs_micro_batches``: the policy's passes honour ``--max-tokens-per-micro-batch``
      (token-budget, padding-free micro-batches; ``relax.models.packing``).
    - ``sharding_modes``: the ``--sharding`` values it implements (``none``: whole weights per rank).
    - ``gives_distributions``: ``train_step(..., with_distribution=True)`` hands the loss every position's
      whole distribution (a method whose ``teacher_top_k()`` is not None, GKD, needs it).

    ``forward_is_collective`` (per instance): every forward pass gathers weights from all ranks, so a
    rank without rows still joins each pass; the frozen reference then goes through ``shard_frozen``
    and ``frozen_log_probs`` (``relax.backends.sharded_backend``).

    Per-instance data-parallel identity (set by the constructor): ``dp_rank`` / ``dp_size`` choose
    this rank's data shard, ``dp_group`` is the process group of the ranks holding different shards
    (None for one rank), and ``writes_shared_fields`` says whether this rank writes the fields its
    model-parallel peers would write identically (one writer per data shard).
    """

    name: ClassVar[str]
    gathers_on_all_ranks: ClassVar[bool] = False
    supports_critic: ClassVar[bool] = False
    packs_micro_batches: ClassVar[bool] = False
    sharding_modes: ClassVar[tuple[str, ...]] = ("none",)
    gives_distributions: ClassVar[bool] = False

    dp_rank: int = 0
    dp_size: int = 1
    dp_group = None
    writes_shared_fields: bool = True
    forward_is_collective: bool = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.supports_critic and cls.compute_values is TrainingBackend.compute_values:
            raise TypeError(f"{cls.__name__} sets supports_critic but does not implement compute_values")

    # -- the registry's light questions (must not import the backend's heavy dependencies) -----

    @classmethod
    def config_errors(cls, config) -> list[str]:
        """Everything ``config`` (a ``RunConfig``) asks of this backend that it cannot do, each a
        message naming the flag to change; checked before any worker starts."""
        from relax.backends import optim

        return optim.config_errors(config)

    @classmethod
    def load(cls) -> type["TrainingBackend"]:
        """The class that trains; a light registry entry overrides this to import its backend lazily."""
        return cls

    # -- construction -------------------------------------------------------------------------

    @classmethod
    @abc.abstractmethod
    def for_policy(cls, config, model: nn.Module, *, process_group=None) -> "TrainingBackend":
        """The actor's backend for one rank, starting from ``model``'s weights (``config``: the
        ``RunConfig``). Called once the ranks' ``process_group`` exists (None for one rank)."""

    @classmethod
    def for_critic(cls, config, model: nn.Module, *, process_group=None) -> "TrainingBackend":
        """A backend training ``model`` (a ``relax.models.value.ValueModel``) whose ``train_step``
        hands ``TokenValues`` to the loss. Only when ``supports_critic``."""
        raise NotImplementedError(f"--backend {cls.name} has no critic (value-head) backend")

    @classmethod
    def process_group_kind(cls, model: nn.Module) -> str:
        """The ``torch.distributed`` backend its ranks need: ``nccl`` for CUDA models, else ``gloo``."""
        on_gpu = torch.cuda.is_available() and next(model.parameters()).is_cuda
        return "nccl" if on_gpu else "gloo"

    @property
    def device(self) -> torch.device:
        """Where this rank's model computes. The actor moves each step's tensors, which the data plane
        hands over on the CPU, here once after reading them. By default the device of the first
        parameter of ``self.model``; a backend that keeps its parameters elsewhere overrides it."""
        model = getattr(self, "model", None)
        if isinstance(model, nn.Module):
            for param in model.parameters():
                return param.device
        return torch.device("cpu")

    # -- training -----------------------------------------------------------------------------

    @abc.abstractmethod
    def compute_log_probs(
        self, batch: TokenBatch, *, with_entropy: bool = False, micro_batch_size: int | None = None
    ) -> TokenLogProbs:
        """Per-token log-probs (and entropy) of the response tokens, without gradients."""

    @abc.abstractmethod
    def train_step(
        self, batch: TokenBatch, loss_fn: LossFn, *, micro_batch_size: int | None = None, with_entropy: bool = True
    ) -> dict[str, float]:
        """One optimizer step over ``batch``: forward (with gradients) per micro-batch, ``loss_fn``,
        backward, gradient clipping, optimizer step. The micro-batch losses are summed, so ``loss_fn``
        must normalize by whole-batch counts (``PolicyLossInputs.global_num_tokens``). Returns metrics,
        including ``grad_norm`` (before clipping) and the loss metrics summed over micro-batches (they are
        shares of the mini-batch, like the loss: see ``PolicyLossOutput``). ``with_entropy``: whether
        the loss needs the per-token entropy. ``with_distribution=True`` (only asked of a backend that
        ``gives_distributions``): ``TokenLogProbs.all_log_probs`` holds each position's whole distribution."""

    def compute_values(self, batch: TokenBatch, *, micro_batch_size: int | None = None) -> torch.Tensor:
        """The critic's per-token values ``[N, T]`` of the response tokens, without gradients (a
        backend built by ``for_critic``; required when ``supports_critic``)."""
        raise NotImplementedError(f"--backend {self.name} has no critic (value-head) backend")

    def shard_frozen(self, model: nn.Module) -> nn.Module:
        """The frozen reference model as this backend's ranks hold it (``forward_is_collective``: sharded)."""
        return model

    def frozen_log_probs(self, model: nn.Module, batch: TokenBatch, *, micro_batch_size: int | None) -> torch.Tensor:
        """``[N, T]`` log-probs of a ``shard_frozen`` model, with every rank in lock-step (only when
        ``forward_is_collective``; otherwise the runtime runs the reference pass itself)."""
        raise NotImplementedError(f"--backend {self.name} runs no collective reference pass")

    # -- state ----------------------------------------------------------------------------------

    @abc.abstractmethod
    def state_dict(self) -> dict:
        """Everything needed to resume exactly: model, optimizer, RNG/step counters (a collective when
        ``gathers_on_all_ranks``)."""

    @abc.abstractmethod
    def load_state_dict(self, state: Mapping) -> None: ...

    @classmethod
    def weights_in_state(cls, state: Mapping) -> Mapping[str, torch.Tensor]:
        """The weights a rollout engine loads, found in a ``state_dict()`` of this backend (checkpoint
        restore and the Hugging Face export read them from here): by default its ``"model"`` entry,
        the same tensors ``export_weights`` gives."""
        return state["model"]

    @abc.abstractmethod
    def export_weights(self) -> dict[str, torch.Tensor]:
        """Whole model weights in the rollout engine's naming (the torch module's ``state_dict`` names;
        a collective when ``gathers_on_all_ranks``)."""
