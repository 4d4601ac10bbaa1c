"""Interfaces of the rollout layer: prompts, tokenizers, generation engines, reward functions.

A reward function has one signature for built-in and user functions::

    def reward(prompt: str, completion: str, label, metadata: Mapping) -> float | Mapping[str, float]

(``async def`` works too). A plain number is the single component ``"reward"``.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any, Protocol

import attrs
import torch

from relax.models.batch import TokenBatch


@attrs.frozen
class Prompt:
    text: str
    label: Any = None
    metadata: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 8
    # top_k / min_p: the vLLM and tiny engines; stop: vLLM only (relax.rollout.engines refuses the
    # others).
    top_k: int = 0  # 0: no top-k
    min_p: float = 0.0  # 0: no min-p
    stop: tuple[str, ...] = ()  # stop strings, kept in the completion


@attrs.frozen
class Generation:
    """``batch`` holds prompt and response tokens; ``log_probs`` ``[N, T]`` are the sampling
    log-probs of the response tokens (zero where the response mask is false)."""

    batch: TokenBatch
    log_probs: torch.Tensor


class Tokenizer(Protocol):
    pad_id: int
    eos_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class GenerationEngine(abc.ABC):
    tokenizer: Tokenizer

    @abc.abstractmethod
    def generate(
        self, prompt_ids: list[list[int]], params: SamplingParams, generator: torch.Generator | None = None
    ) -> Generation:
        """Sample one completion per prompt (repeat a prompt n times for a group)."""

    @abc.abstractmethod
    def load_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Take the trainer's exported weights (``TrainingBackend.export_weights``)."""

    def decode_responses(self, generation: Generation) -> list[str]:
        """The completion text of every row: its real response tokens (an end-of-sequence token the
        row stopped on is kept), decoded by the engine's tokenizer."""
        batch = generation.batch
        # Plain lists, not per-row tensor indexing (256 small tensor ops cost ~1 ms on 2 cores).
        return [
            self.tokenizer.decode([t for t, m in zip(ids, mask) if m])
            for ids, mask in zip(batch.response_ids.tolist(), batch.response_mask.tolist())
        ]
