"""``VLLMEngine``: generation with vLLM inside the rollout worker's process.

The engine holds a ``vllm.LLM`` built from the ``--hf-checkpoint`` directory and speaks token ids
both ways: relax's own tokenizer (``relax.models.hf.loading``) encodes the prompts and decodes the
completions, exactly as with the transformers engine, so the two engines see the same prompts.
vLLM loads its own tokenizer only when stop strings must be matched on text.

Log-prob convention (the same as the other engines): for every sampled token, its log-prob under the
distribution it was drawn from -- vLLM's ``processed_logprobs`` (after temperature, top-k, top-p and
min-p), 0 for greedy decoding. With temperature scaling only, this is what the trainer computes as its
old log-probs, and their mean distance is logged as ``rollout/logprob_abs_diff``.

Randomness: each request gets its own vLLM seed, drawn from the worker's ``torch.Generator``, so a
run is reproducible and a resumed run (which restores the generator) continues the same stream.

New weights go in with ``collective_rpc("reload_weights", weights_iterator=...)``: the tensors
pass in-process, in Hugging Face names (what ``TrainingBackend.export_weights`` sends); then the
prefix cache is dropped, since it holds keys and values computed with the old weights.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from relax.models.batch import TokenBatch
from relax.rollout.base import Generation, GenerationEngine, SamplingParams
from relax.rollout.hf.engine import check_sampling_params, left_pad

SEED_BOUND = 2**31 - 1  # vLLM seeds are int32-safe


class VLLMEngine(GenerationEngine):
    """``generate`` / ``load_weights`` over an in-process ``vllm.LLM`` (built by ``relax.rollout.vllm.factory``).

    Rows are laid out like ``HFEngine``'s: left-padded prompts; responses right-padded with
    ``pad_id`` (mask false, log-prob 0); a stop token (EOS or another ``tokenizer.stop_ids`` id)
    ends the row and is kept in the response.
    """

    def __init__(self, llm, tokenizer, *, base_weights=None):
        self.llm = llm
        self.tokenizer = tokenizer
        self._stop_ids = list(tokenizer.stop_ids)
        # For LoRA payloads: the checkpoint's own weights, read on first use (relax.rollout.vllm.lora).
        self._base_weights = base_weights

    def _request_params(self, params: SamplingParams, seed: int | None):
        from vllm import SamplingParams as VLLMSamplingParams

        stop = list(params.stop)
        return VLLMSamplingParams(
            n=1,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k or -1,  # -1: vLLM's "no top-k"
            min_p=params.min_p,
            max_tokens=params.max_new_tokens,
            # relax's tokenizer alone says where a row stops (as in the other engines): its stop ids,
            # not vLLM's own reading of the checkpoint's EOS
            ignore_eos=True,
            stop_token_ids=self._stop_ids,
            stop=stop or None,
            include_stop_str_in_output=True,  # like a stop token, the matched text stays in the response
            detokenize=bool(stop),
            logprobs=0,  # the sampled token's own log-prob
            seed=seed,
        )

    def generate(
        self, prompt_ids: list[list[int]], params: SamplingParams, generator: torch.Generator | None = None
    ) -> Generation:
        from vllm.inputs import TokensPrompt

        check_sampling_params(params)
        prompt, prompt_mask = left_pad(prompt_ids, self.tokenizer.pad_id)
        seeds = torch.randint(0, SEED_BOUND, (len(prompt_ids),), generator=generator).tolist()
        requests = [TokensPrompt(prompt_token_ids=list(ids)) for ids in prompt_ids]
        outputs = self.llm.generate(requests, [self._request_params(params, s) for s in seeds], use_tqdm=False)
        responses = [out.outputs[0] for out in outputs]
        return Generation(*self._rows(prompt, prompt_mask, responses, greedy=params.temperature == 0))

    def _rows(self, prompt, prompt_mask, responses, *, greedy: bool) -> tuple[TokenBatch, torch.Tensor]:
        width = max(max((len(r.token_ids) for r in responses), default=0), 1)
        n = len(responses)
        tokens = torch.full((n, width), self.tokenizer.pad_id, dtype=torch.long)
        mask = torch.zeros((n, width), dtype=torch.bool)
        log_probs = torch.zeros((n, width), dtype=torch.float32)
        for i, r in enumerate(responses):
            ids = list(r.token_ids)
            tokens[i, : len(ids)] = torch.as_tensor(ids, dtype=torch.long)
            mask[i, : len(ids)] = True
            if not greedy:  # greedy: the sampled distribution is a point mass (log-prob 0)
                log_probs[i, : len(ids)] = torch.tensor(
                    [step[token].logprob for step, token in zip(r.logprobs, ids)], dtype=torch.float32
                )
        batch = TokenBatch(prompt_ids=prompt, prompt_mask=prompt_mask, response_ids=tokens, response_mask=mask)
        return batch, log_probs

    def load_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Load the trainer's weights (Hugging Face names) into the running engine; a LoRA adapter
        payload is merged into the checkpoint's base weights first."""
        from relax.models.hf.lora import is_adapter_payload

        if is_adapter_payload(weights):
            from relax.rollout.vllm.lora import merged_weights

            weights = merged_weights(self._base_weights(), weights)
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(list(weights.items()))})
        self.llm.reset_prefix_cache()
