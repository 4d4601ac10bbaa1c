"""``HFEngine``: batched, KV-cached sampling from a Hugging Face causal LM.

Our own loop over the model's KV cache rather than ``model.generate``: it returns, for every chosen
token, the exact log-prob under the distribution the token was drawn from, computed from the same
logits tensor (no second pass, no processor stack that could reorder or rescale scores).

Log-prob convention (the same as ``TinyEngine``): the log-prob of the chosen token under the
distribution it was actually drawn from -- ``logits / temperature``, restricted to the top-p nucleus
and renormalised. With top-p 1 this is ``log_softmax(logits / temperature)``, which is exactly what
``TorchBackend(temperature=...)`` computes for the same weights (up to float rounding between a
cached and an uncached forward pass). With top-p < 1 the trainer's log-probs differ on purpose: it
scores the full distribution.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Mapping, Sequence

import torch

from relax.models.batch import TokenBatch
from relax.models.hf.loading import HFTokenizer, load_hf_state_dict
from relax.models.sampled_distribution import Truncation, dropped_tokens
from relax.rollout.base import Generation, GenerationEngine, SamplingParams
from relax.rollout.hf.decoding import (
    DynamicDecoding,
    GraphCaptureError,
    StaticDecoding,
    static_decoding_unsupported,
)

DECODINGS = ("auto", "dynamic", "static", "cuda-graphs")


def left_pad(prompt_ids: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[N, P]`` int64 ids (left-padded with ``pad_id``) and their bool mask."""
    if len(prompt_ids) == 0:
        raise ValueError("generate() needs at least one prompt")
    for i, ids in enumerate(prompt_ids):
        if len(ids) == 0:
            raise ValueError(f"prompt {i} is empty: every prompt needs at least one token")
    width = max(len(ids) for ids in prompt_ids)
    ids = torch.full((len(prompt_ids), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompt_ids), width), dtype=torch.bool)
    for i, row in enumerate(prompt_ids):
        ids[i, width - len(row) :] = torch.as_tensor(list(row), dtype=torch.long)
        mask[i, width - len(row) :] = True
    return ids, mask


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """``logits`` with every token outside the nucleus set to -inf (the top token always stays)."""
    if top_p >= 1.0:
        return logits
    # A token is dropped when the mass of the tokens strictly before it already reaches top_p: the
    # kept-set rule the trainer replays (relax.models.sampled_distribution), ties included.
    return logits.masked_fill(dropped_tokens(logits, Truncation(top_p=top_p)), float("-inf"))


def sample_categorical(log_probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row of ``log_probs`` ``[B, V]``, drawn exactly from ``exp(log_probs)``.

    Inverse-CDF sampling: one uniform number per row and a search in the float64 cumulative sum.
    ``torch.multinomial`` draws one exponential per vocabulary entry instead, which made it ~20 % of
    a decoding step on CPU for a 4k vocabulary (measured in ``benchmarks/hf_rollout.py``). A token of
    probability 0 (outside the top-p nucleus) is never returned: the search finds the first entry
    whose cumulative mass exceeds the draw, and such an entry adds positive mass.

    The uniforms are drawn on the generator's own device and then moved, so a CPU generator (the
    rollout worker's, whose state is checkpointed) drives a GPU model, and one seed gives the same
    draws on every device.
    """
    cdf = log_probs.double().exp().cumsum(dim=-1)
    draw_device = generator.device if generator is not None else log_probs.device
    u = torch.rand((log_probs.shape[0], 1), generator=generator, device=draw_device, dtype=torch.float64)
    u = u.to(log_probs.device)
    return torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(1).clamp_(max=log_probs.shape[-1] - 1)


def check_sampling_params(params: SamplingParams) -> None:
    if not params.temperature >= 0:
        raise ValueError(f"--rollout-temperature must be >= 0 (0 = greedy), got {params.temperature}")
    if not 0 < params.top_p <= 1:
        raise ValueError(f"--rollout-top-p must be in (0, 1], got {params.top_p}")
    if params.max_new_tokens < 1:
        raise ValueError(f"--rollout-max-response-len must be >= 1, got {params.max_new_tokens}")


class _CacheCall:
    """Passes / reads the KV cache under the name this transformers version uses
    (``cache`` in 5.x, ``past_key_values`` before)."""

    def __init__(self, model: torch.nn.Module):
        params = inspect.signature(model.forward).parameters
        self.arg = "cache" if "cache" in params else "past_key_values"

    def __call__(self, model, cache, **kwargs):
        if cache is not None:
            kwargs[self.arg] = cache
        out = model(use_cache=True, **kwargs)
        new_cache = getattr(out, "cache", None)
        if new_cache is None:
            new_cache = out.past_key_values
        return out.logits, new_cache


def choose_tokens(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The next token of every row from its logits ``[N, V]``, and the log-probs ``[N, V]`` of the
    distribution it was drawn from (temperature, then the top-p nucleus; greedy: a point mass, 0)."""
    if params.temperature == 0:  # greedy: the sampled distribution is a point mass (log-prob 0)
        chosen = logits.argmax(dim=-1)
        return chosen, torch.zeros(logits.shape[0], logits.shape[-1], device=logits.device)
    scaled = logits.float() / params.temperature
    step_log_probs = torch.log_softmax(top_p_filter(scaled, params.top_p), dim=-1)
    return sample_categorical(step_log_probs, generator), step_log_probs


_said: set[str] = set()


def _say_once(message: str) -> None:
    """A fallback the user should know about, once per process (rollout workers print to the run's console)."""
    if message not in _said:
        _said.add(message)
        warnings.warn(f"relax: {message}", RuntimeWarning, stacklevel=3)


class HFEngine(GenerationEngine):
    """Generation from any ``transformers`` causal LM (the rollout side of ``--hf-checkpoint``).

    ``generate`` left-pads the prompts, runs one forward over them, then one cached forward per new
    token for the whole batch. A row stops after its first stop token (EOS or another id of
    ``tokenizer.stop_ids``), which is kept in the response and masked in; later columns are padding
    (``pad_id``, mask false, log-prob 0). The loop ends early once every row has stopped.

    The model runs on ``device`` (default: where it is); the returned tensors are on the CPU.
    ``decoding`` picks how the forward passes run (``relax.rollout.hf.decoding``): by default a
    static cache with the decode step replayed as a CUDA graph on CUDA, the dynamic cache elsewhere;
    the sampling and its log-probs are the same code either way.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: HFTokenizer,
        *,
        device: str | torch.device | None = None,
        decoding: str = "auto",
    ):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.model.to(self.device)
        self._call = _CacheCall(model)
        self._stop_ids = torch.tensor(tokenizer.stop_ids, dtype=torch.long, device=self.device)
        self._decoding = self._make_decoding(decoding)

    @property
    def decoding(self) -> str:
        """How the model runs: "dynamic cache", "static cache" or "static cache + CUDA graphs"."""
        return self._decoding.name

    def _make_decoding(self, choice: str):
        """``choice``: "auto" (CUDA graphs on CUDA, else the dynamic cache), "dynamic", "static"
        (eager steps over a static cache: the CUDA-graph path without the capture) or "cuda-graphs"."""
        if choice not in DECODINGS:
            raise ValueError(f"decoding must be one of {', '.join(DECODINGS)}, got {choice!r}")
        if choice == "auto":
            choice = "cuda-graphs" if self.device.type == "cuda" else "dynamic"
        if choice == "dynamic":
            return DynamicDecoding(self.model, self._call)
        why_not = static_decoding_unsupported(self.model)
        if choice == "cuda-graphs" and self.device.type != "cuda":
            why_not = f"CUDA graphs need a CUDA device, the model is on {self.device}"
        if why_not is not None:
            _say_once(f"the transformers engine decodes without a static cache / CUDA graphs: {why_not}")
            return DynamicDecoding(self.model, self._call)
        return StaticDecoding(self.model, self._call, pad_id=self.tokenizer.pad_id,
                              cuda_graphs=choice == "cuda-graphs")

    @torch.inference_mode()
    def generate(
        self, prompt_ids: list[list[int]], params: SamplingParams, generator: torch.Generator | None = None
    ) -> Generation:
        check_sampling_params(params)
        prompt, prompt_mask = left_pad(prompt_ids, self.tokenizer.pad_id)
        try:
            self._decoding.begin(prompt.shape[0], prompt.shape[1], params.max_new_tokens)
        except GraphCaptureError as exc:  # before any sampling: the generator has not moved
            _say_once(f"the transformers engine could not capture its decode step as a CUDA graph ({exc}); "
                      "it decodes eagerly with a dynamic cache from now on")
            self._decoding = DynamicDecoding(self.model, self._call)
            self._decoding.begin(prompt.shape[0], prompt.shape[1], params.max_new_tokens)
        return self._sample(prompt, prompt_mask, params, generator)

    def _sample(self, prompt, prompt_mask, params: SamplingParams, generator) -> Generation:
        pad_id = self.tokenizer.pad_id
        n = prompt.shape[0]
        dev = self.device

        width = prompt.shape[1]
        # One mask buffer for prompt + response columns; step t attends to its first width + t + 1.
        attention = torch.zeros((n, width + params.max_new_tokens), dtype=torch.long, device=dev)
        attention[:, :width] = prompt_mask.to(dev)
        positions = (attention[:, :width].cumsum(dim=1) - 1).clamp(min=0)  # as TokenBatch.position_ids
        next_position = attention.sum(dim=1)  # [N] position of the first response token
        tokens = torch.full((n, params.max_new_tokens), pad_id, dtype=torch.long, device=dev)
        log_probs = torch.zeros((n, params.max_new_tokens), dtype=torch.float32, device=dev)
        alive = torch.ones(n, dtype=torch.bool, device=dev)  # has not emitted a stop token yet
        response_mask = torch.zeros((n, params.max_new_tokens), dtype=torch.bool, device=dev)

        logits = self._decoding.prefill(prompt.to(dev), attention[:, :width], positions)
        for t in range(params.max_new_tokens):
            chosen, step_log_probs = choose_tokens(logits, params, generator)
            chosen = torch.where(alive, chosen, torch.full_like(chosen, pad_id))
            tokens[:, t] = chosen
            response_mask[:, t] = alive
            log_probs[:, t] = torch.where(alive, step_log_probs.gather(1, chosen[:, None]).squeeze(1), 0.0)
            alive = alive & ~torch.isin(chosen, self._stop_ids)
            if t + 1 == params.max_new_tokens or not bool(alive.any()):
                break
            # Stopped rows keep feeding padding that nothing attends to (mask false).
            attention[:, width + t] = response_mask[:, t]
            logits = self._decoding.step(chosen, attention[:, : width + t + 1], next_position + t)
        longest = max(int(response_mask.sum(dim=1).max()), 1)
        batch = TokenBatch(
            prompt_ids=prompt,
            prompt_mask=prompt_mask,
            response_ids=tokens[:, :longest].cpu(),
            response_mask=response_mask[:, :longest].cpu(),
        )
        return Generation(batch=batch, log_probs=log_probs[:, :longest].cpu())

    @torch.no_grad()
    def load_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Copy the trainer's weights (HF ``state_dict`` names) into the model, casting dtype/device."""
        load_hf_state_dict(self.model, weights)
