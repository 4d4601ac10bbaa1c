"""``TinyEngine``: batched, KV-cached sampling from a ``TinyCausalLM``.

One forward pass over the left-padded prompts fills the cache, then one single-token step per new
token. Each row stops at its own ``<eos>`` (the ``<eos>`` is part of the response and its mask is
True; later columns are ``<pad>`` with mask False). The response width is the longest row.

``Generation.log_probs`` are the log-probs of the sampled tokens under the distribution actually
sampled from: logits divided by the temperature, then restricted to the top-p nucleus and
renormalised. Temperature 0 means greedy decoding (log-probs 0). With temperature 1 and top-p 1
(the default recipe) they equal the trainer's ``compute_log_probs`` up to float rounding.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from relax.models.batch import TokenBatch
from relax.models.sampled_distribution import Truncation, dropped_tokens
from relax.models.tiny.model import KVCache, TinyCausalLM
from relax.models.tiny.tokenizer import TinyTokenizer
from relax.rollout.base import Generation, GenerationEngine, SamplingParams


def left_pad(prompt_ids: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """-> ``(ids [N, P], mask [N, P])`` with every prompt right-aligned at column P."""
    if not prompt_ids or any(len(p) == 0 for p in prompt_ids):
        raise ValueError("generate needs at least one prompt and every prompt needs at least one token")
    width = max(len(p) for p in prompt_ids)
    ids = torch.full((len(prompt_ids), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompt_ids), width), dtype=torch.bool)
    for row, p in enumerate(prompt_ids):
        ids[row, width - len(p):] = torch.as_tensor(p, dtype=torch.long)
        mask[row, width - len(p):] = True
    return ids, mask


def sampling_log_probs(logits: torch.Tensor, temperature: float, top_p: float, top_k: int = 0,
                       min_p: float = 0.0) -> torch.Tensor:
    """Log-probs ``[B, V]`` of the distribution to sample from; tokens outside the kept set are -inf.

    The kept set: min-p, then the ``top_k`` most likely tokens, then the nucleus, the smallest set of
    most likely tokens whose mass reaches ``top_p`` (the most likely token is always kept)."""
    scores = logits.float() / temperature
    log_probs = torch.log_softmax(scores, dim=-1)
    truncation = Truncation(top_p=top_p, top_k=top_k, min_p=min_p)
    if not truncation.truncates:
        return log_probs
    # the kept-set rule the trainer replays (relax.models.sampled_distribution), ties included
    drop = dropped_tokens(scores, truncation)
    return torch.log_softmax(log_probs.masked_fill(drop, float("-inf")), dim=-1)


def _draw(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of ``probs``. A generator on another device (the rollout worker's CPU
    generator, whose state is checkpointed, with a model on a GPU) draws on its own device."""
    if generator is not None and generator.device != probs.device:
        return torch.multinomial(probs.to(generator.device), 1, generator=generator).squeeze(1).to(probs.device)
    return torch.multinomial(probs, 1, generator=generator).squeeze(1)


class TinyEngine(GenerationEngine):
    """Runs on its model's device (``to`` moves it: the rollout worker's GPU, when it has one); the
    tensors it returns are on the CPU, for the data plane."""

    def __init__(self, model: TinyCausalLM, tokenizer: TinyTokenizer | None = None):
        self.model = model.eval()
        self.tokenizer = tokenizer if tokenizer is not None else TinyTokenizer()

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def to(self, device: str | torch.device) -> TinyEngine:
        self.model.to(device)
        return self

    @torch.inference_mode()
    def generate(
        self, prompt_ids: list[list[int]], params: SamplingParams, generator: torch.Generator | None = None
    ) -> Generation:
        if params.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {params.temperature}")
        if not 0.0 < params.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {params.top_p}")
        if params.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {params.max_new_tokens}")
        pad, eos = self.tokenizer.pad_id, self.tokenizer.eos_id
        ids, prompt_mask = left_pad(prompt_ids, pad)
        n, width = ids.shape
        dev = self.device
        cache = KVCache(self.model.config, n, width + params.max_new_tokens, device=dev)
        positions = (prompt_mask.long().cumsum(1) - 1).clamp(min=0).to(dev)
        logits, _ = self.model(ids.to(dev), prompt_mask.to(dev), positions, kv_cache=cache)
        next_logits, next_pos = logits[:, -1], positions[:, -1] + 1

        tokens, masks, token_lps = [], [], []
        mask_so_far = prompt_mask.to(dev)
        done = torch.zeros(n, dtype=torch.bool, device=dev)
        for _ in range(params.max_new_tokens):
            if params.temperature == 0:  # greedy: the sampled distribution is a point mass
                token = next_logits.argmax(dim=-1)
                lp = torch.full_like(next_logits, float("-inf")).scatter(1, token[:, None], 0.0)
            else:
                lp = sampling_log_probs(next_logits, params.temperature, params.top_p, params.top_k, params.min_p)
                token = _draw(lp.exp(), generator)
            live = ~done
            token = torch.where(live, token, torch.full_like(token, pad))
            tokens.append(token)
            masks.append(live)
            token_lps.append(torch.where(live, lp.gather(1, token[:, None]).squeeze(1), 0.0))
            done = done | (token == eos)
            if bool(done.all()) or len(tokens) == params.max_new_tokens:
                break
            mask_so_far = torch.cat([mask_so_far, live[:, None]], dim=1)
            logits, _ = self.model(token[:, None], mask_so_far, next_pos[:, None], kv_cache=cache)
            next_logits, next_pos = logits[:, -1], next_pos + 1

        batch = TokenBatch(
            prompt_ids=ids,
            prompt_mask=prompt_mask,
            response_ids=torch.stack(tokens, dim=1).cpu(),
            response_mask=torch.stack(masks, dim=1).cpu(),
        )
        return Generation(batch=batch, log_probs=torch.stack(token_lps, dim=1).float().cpu())

    def load_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        self.model.load_state_dict(dict(weights), strict=True)
