"""Token batches shared by the rollout engines and the training backends.

Layout of a batch (``TokenBatch``): prompts are *left*-padded to width P and responses *right*-padded
to width T, so every response starts at column P and per-token tensors of the algorithm layer are
``[N, T]`` aligned with ``response_ids``. The log-prob of response token t is read from the logits at
column ``P + t - 1``.

Multi-turn episodes (``relax.rollout.environments``) put the environment's turns inside the
response: those tokens are attended to but are not the model's, so they get no gradient and count in
no denominator. ``response_mask`` is therefore always the *loss* mask (True = a token the policy
sampled), and ``response_attention_mask`` says which response columns are real tokens (model or
environment). It is None for single-turn batches, where both masks are the same tensor.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import torch
from torch import nn

from relax.models.sampled_distribution import Truncation, entropy_of, sampled_log_softmax


@attrs.frozen(kw_only=True)
class TokenBatch:
    prompt_ids: torch.Tensor  # [N, P] int64, left-padded
    prompt_mask: torch.Tensor  # [N, P] bool
    response_ids: torch.Tensor  # [N, T] int64, right-padded
    response_mask: torch.Tensor  # [N, T] bool: the loss mask (tokens the policy sampled)
    # [N, T] bool: real response tokens, the environment's included; None = response_mask
    response_attention_mask: torch.Tensor | None = None

    def __attrs_post_init__(self):
        n = self.prompt_ids.shape[0]
        if self.prompt_mask.shape != self.prompt_ids.shape or self.response_mask.shape != self.response_ids.shape:
            raise ValueError("each mask must have the shape of its ids")
        if self.response_ids.shape[0] != n:
            raise ValueError(f"prompt rows ({n}) != response rows ({self.response_ids.shape[0]})")
        attended = self.response_attention_mask
        if attended is not None:
            if attended.shape != self.response_ids.shape:
                raise ValueError("response_attention_mask must have the shape of response_ids")
            if bool((self.response_mask.bool() & ~attended.bool()).any()):
                raise ValueError("every token in response_mask (the loss mask) must be in response_attention_mask")

    def __len__(self) -> int:
        return self.prompt_ids.shape[0]

    @property
    def prompt_width(self) -> int:
        return self.prompt_ids.shape[1]

    @property
    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.prompt_ids, self.response_ids], dim=1)

    @property
    def response_attended(self) -> torch.Tensor:
        """``[N, T]`` bool: the response columns that hold a real token (model or environment)."""
        return self.response_mask if self.response_attention_mask is None else self.response_attention_mask

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.prompt_mask, self.response_attended], dim=1)

    @property
    def position_ids(self) -> torch.Tensor:
        """Positions counted from each row's first real token (left padding gets position 0)."""
        return (self.attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)

    def select(self, rows) -> TokenBatch:
        return TokenBatch(
            prompt_ids=self.prompt_ids[rows],
            prompt_mask=self.prompt_mask[rows],
            response_ids=self.response_ids[rows],
            response_mask=self.response_mask[rows],
            response_attention_mask=_apply(self.response_attention_mask, lambda m: m[rows]),
        )

    def to(self, device: torch.device | str) -> TokenBatch:
        return TokenBatch(
            prompt_ids=self.prompt_ids.to(device),
            prompt_mask=self.prompt_mask.to(device),
            response_ids=self.response_ids.to(device),
            response_mask=self.response_mask.to(device),
            response_attention_mask=_apply(self.response_attention_mask, lambda m: m.to(device)),
        )


def masked_row() -> TokenBatch:
    """One fully masked dummy row (``.select(slice(0, 0))``: no rows). A rank that holds nothing of a
    mini-batch still runs a forward (and backward: zero loss, zero gradient) on it, so that it joins
    the collectives of the ranks that do. Built on the CPU like every batch a worker receives: the
    backend moves it to the model's device with the rest (``TorchBackend._to_device``)."""
    one = torch.zeros((1, 1), dtype=torch.long)
    return TokenBatch(prompt_ids=one, prompt_mask=torch.ones((1, 1), dtype=torch.bool), response_ids=one,
                      response_mask=torch.zeros((1, 1), dtype=torch.bool))


def _apply(mask: torch.Tensor | None, fn) -> torch.Tensor | None:
    return None if mask is None else fn(mask)


@attrs.frozen
class TokenValues:
    values: torch.Tensor  # [N, T] float32 critic values of the response positions, zero where masked


@attrs.frozen
class TokenLogProbs:
    log_probs: torch.Tensor  # [N, T] float32, zero where response_mask is false
    entropy: torch.Tensor | None = None  # [N, T] float32 or None
    # [N, T, V] float32: the whole distribution at each response position (the log-softmax the sampled
    # token's log-prob is read from; zero outside the mask), only when asked (``with_distribution``):
    # a distillation loss over the vocabulary (GKD) reads it: one micro-batch's [n, T, V] at a time.
    all_log_probs: torch.Tensor | None = None


ForwardLogits = Callable[[nn.Module, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def default_forward_logits(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
) -> torch.Tensor:
    """``model(input_ids=, attention_mask=, position_ids=)`` -> logits ``[N, S, V]``.

    Accepts a tensor, a tuple whose first item is the logits, or an object with ``.logits``
    (transformers). The mask is passed as int64, which both ``TinyCausalLM`` and transformers accept.
    """
    out = model(input_ids=input_ids, attention_mask=attention_mask.long(), position_ids=position_ids)
    if isinstance(out, torch.Tensor):
        return out
    if hasattr(out, "logits"):
        return out.logits
    if isinstance(out, tuple):
        return out[0]
    raise TypeError(f"cannot find logits in the model output of type {type(out).__name__}; pass forward_logits=")


def response_log_probs(
    logits: torch.Tensor, batch: TokenBatch, *, with_entropy: bool, temperature: float = 1.0,
    truncation: Truncation | None = None, with_distribution: bool = False,
) -> TokenLogProbs:
    """Log-probs (and entropy) ``[N, T]`` of ``batch.response_ids`` from full-sequence ``logits``, of
    the distribution the rollout sampled from (``relax.models.sampled_distribution``: ``truncation``
    None = the whole vocabulary); with ``with_distribution`` that whole distribution ``[N, T, V]`` too."""
    p, t = batch.prompt_width, batch.response_ids.shape[1]
    scores = logits[:, p - 1 : p + t - 1].float()
    if temperature != 1.0:
        scores = scores / temperature
    log_probs_all = sampled_log_softmax(scores, truncation, batch.response_ids)
    mask = batch.response_mask
    log_probs = log_probs_all.gather(-1, batch.response_ids.unsqueeze(-1)).squeeze(-1) * mask
    entropy = None
    if with_entropy:
        entropy = entropy_of(log_probs_all) * mask
    distribution = log_probs_all * mask.unsqueeze(-1) if with_distribution else None
    return TokenLogProbs(log_probs=log_probs, entropy=entropy, all_log_probs=distribution)
