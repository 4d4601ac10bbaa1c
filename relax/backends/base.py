"""The training-backend interface (torch today, megatron behind the same interface).

Layout of a batch (``TokenBatch``): prompts are *left*-padded to width P and responses *right*-padded
to width T, so every response starts at column P and per-token tensors of the algorithm layer are
``[N, T]`` aligned with ``response_ids``. The log-prob of response token t is read from the logits at
column ``P + t - 1``.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping

import attrs
import torch

from relax.algorithms.types import PolicyLossOutput


@attrs.frozen(kw_only=True)
class TokenBatch:
    prompt_ids: torch.Tensor  # [N, P] int64, left-padded
    prompt_mask: torch.Tensor  # [N, P] bool
    response_ids: torch.Tensor  # [N, T] int64, right-padded
    response_mask: torch.Tensor  # [N, T] bool

    def __attrs_post_init__(self):
        n = self.prompt_ids.shape[0]
        if self.prompt_mask.shape != self.prompt_ids.shape or self.response_mask.shape != self.response_ids.shape:
            raise ValueError("each mask must have the shape of its ids")
        if self.response_ids.shape[0] != n:
            raise ValueError(f"prompt rows ({n}) != response rows ({self.response_ids.shape[0]})")

    def __len__(self) -> int:
        return self.prompt_ids.shape[0]

    @property
    def prompt_width(self) -> int:
        return self.prompt_ids.shape[1]

    @property
    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.prompt_mask, self.response_mask], dim=1)

    @property
    def position_ids(self) -> torch.Tensor:
        """Positions counted from each row's first real token (left padding gets position 0)."""
        return (self.attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)

    def select(self, rows) -> "TokenBatch":
        return TokenBatch(
            prompt_ids=self.prompt_ids[rows],
            prompt_mask=self.prompt_mask[rows],
            response_ids=self.response_ids[rows],
            response_mask=self.response_mask[rows],
        )


@attrs.frozen
class TokenLogProbs:
    log_probs: torch.Tensor  # [N, T] float32, zero where response_mask is false
    entropy: torch.Tensor | None = None  # [N, T] float32 or None


# loss_fn(token_log_probs, rows) -> PolicyLossOutput. ``rows`` are the batch rows of this
# micro-batch, so the caller can slice its advantages / old log-probs the same way.
LossFn = Callable[[TokenLogProbs, slice], PolicyLossOutput]


class TrainingBackend(abc.ABC):
    """One data-parallel rank's model + optimizer."""

    @abc.abstractmethod
    def compute_log_probs(self, batch: TokenBatch, *, with_entropy: bool = False) -> TokenLogProbs:
        """Per-token log-probs (and entropy) of the response tokens, without gradients."""

    @abc.abstractmethod
    def train_step(self, batch: TokenBatch, loss_fn: LossFn, *, micro_batch_size: int | None = None) -> dict[str, float]:
        """One optimizer step over ``batch``: forward (with gradients) per micro-batch, ``loss_fn``,
        backward, gradient clipping, optimizer step. The micro-batch losses are summed, so ``loss_fn``
        must normalize by whole-batch counts (``PolicyLossInputs.global_num_tokens``). Returns metrics,
        including ``grad_norm`` (before clipping) and the loss metrics summed over micro-batches (they are
        shares of the mini-batch, like the loss: see ``PolicyLossOutput``)."""

    @abc.abstractmethod
    def state_dict(self) -> dict:
        """Everything needed to resume exactly: model, optimizer, RNG/step counters."""

    @abc.abstractmethod
    def load_state_dict(self, state: Mapping) -> None: ...

    @abc.abstractmethod
    def export_weights(self) -> dict[str, torch.Tensor]:
        """Model weights in the rollout engine's naming (the torch module's ``state_dict`` names)."""
