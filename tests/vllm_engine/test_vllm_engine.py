"""``VLLMEngine`` against an independent reference: a teacher-forced transformers forward of the same
sequences (float32), row by row over the real tokens only."""

from __future__ import annotations

import math

import pytest
import torch

from relax.models.hf.loading import load_hf_model
from relax.rollout.base import SamplingParams

PROMPTS = ["what is 3 + 4 ?", "hello", "add the numbers 1 and 2 please", "yes"]


def prompt_ids(engine, repeat=2):
    return [engine.tokenizer.encode(p) for p in PROMPTS] * repeat


def reference_log_probs(model, gen, temperature=1.0, top_p=1.0):
    """log-prob of each response token under softmax(logits / T) restricted to the top-p nucleus."""
    b = gen.batch
    out = torch.zeros_like(gen.log_probs, dtype=torch.float64)
    for i in range(len(b)):
        prompt = b.prompt_ids[i][b.prompt_mask[i]]
        response = b.response_ids[i][b.response_mask[i]]
        with torch.no_grad():
            logits = model(input_ids=torch.cat([prompt, response])[None]).logits[0].double() / temperature
        for t, tok in enumerate(response.tolist()):
            probs = torch.softmax(logits[len(prompt) + t - 1], dim=-1)
            sorted_p, order = probs.sort(descending=True)
            nucleus = order[: int((sorted_p.cumsum(0) < top_p).sum()) + 1].tolist()
            assert tok in nucleus, f"row {i} token {t}: {tok} sampled outside the top-p nucleus"
            out[i, t] = math.log(probs[tok] / probs[nucleus].sum())
    return out


def kept_reference_log_probs(model, gen, keep):
    """log-prob of each response token under softmax(logits) restricted to ``keep(probs)`` (a bool
    mask of the kept tokens) and renormalized."""
    b = gen.batch
    out = torch.zeros_like(gen.log_probs, dtype=torch.float64)
    for i in range(len(b)):
        prompt = b.prompt_ids[i][b.prompt_mask[i]]
        response = b.response_ids[i][b.response_mask[i]]
        with torch.no_grad():
            logits = model(input_ids=torch.cat([prompt, response])[None]).logits[0].double()
        for t, tok in enumerate(response.tolist()):
            probs = torch.softmax(logits[len(prompt) + t - 1], dim=-1)
            kept = keep(probs)
            assert kept[tok], f"row {i} token {t}: {tok} sampled outside the kept set"
            out[i, t] = math.log(probs[tok] / probs[kept].sum())
    return out


def check_layout(gen, tokenizer, max_new_tokens):
    b = gen.batch
    assert b.response_ids.shape == b.response_mask.shape == gen.log_probs.shape
    assert b.response_ids.shape[1] <= max_new_tokens and b.prompt_mask[:, -1].all()
    stop = set(tokenizer.stop_ids)
    for i in range(len(b)):
        length = int(b.response_mask[i].sum())
        assert b.response_mask[i, :length].all() and not b.response_mask[i, length:].any()
        assert (b.response_ids[i, length:] == tokenizer.pad_id).all() and (gen.log_probs[i, length:] == 0).all()
        real = b.response_ids[i, :length].tolist()
        # a row ends at its first stop token (kept), or at the length limit
        assert not stop & set(real[:-1])
        assert real[-1] in stop or length == max_new_tokens


@pytest.fixture(scope="module")
def hf_model(qwen2_checkpoint):
    return load_hf_model(qwen2_checkpoint)


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 1.0), (1.0, 0.8)])
def test_log_probs_match_a_teacher_forced_transformers_forward(engine, hf_model, temperature, top_p):
    params = SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=12)
    gen = engine.generate(prompt_ids(engine), params, generator=torch.Generator().manual_seed(0))
    check_layout(gen, engine.tokenizer, 12)
    mask = gen.batch.response_mask
    assert mask.sum() > len(mask)  # several tokens per row on average: the comparison covers decoding
    assert (gen.log_probs[mask] <= 0).all() and (gen.log_probs[mask] < 0).any()  # 0: a one-token nucleus
    diff = (gen.log_probs.double() - reference_log_probs(hf_model, gen, temperature, top_p)).abs()[mask]
    assert float(diff.max()) < 1e-4, f"max |engine - reference| = {float(diff.max()):.3g}"


def test_greedy_decoding_follows_the_argmax_with_log_prob_zero(engine, hf_model):
    gen = engine.generate(prompt_ids(engine, 1), SamplingParams(temperature=0.0, max_new_tokens=6))
    b = gen.batch
    assert (gen.log_probs == 0).all()
    for i in range(len(b)):
        ids = b.prompt_ids[i][b.prompt_mask[i]]
        for tok in b.response_ids[i][b.response_mask[i]].tolist():
            with torch.no_grad():
                expected = int(hf_model(input_ids=ids[None]).logits[0, -1].argmax())
            assert tok == expected
            ids = torch.cat([ids, torch.tensor([tok])])


def test_a_seeded_generator_reproduces_the_samples(engine):
    params = SamplingParams(temperature=1.0, max_new_tokens=10)

    def sample(seed):
        return engine.generate(prompt_ids(engine), params, generator=torch.Generator().manual_seed(seed)).batch

    a, b, c = sample(5), sample(5), sample(6)
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.response_mask, b.response_mask)
    assert not torch.equal(a.response_ids[:, :3], c.response_ids[:, :3])


def test_reloaded_weights_change_the_log_probs_to_the_new_model(engine, hf_model, qwen2_checkpoint, tmp_path):
    from tiny_checkpoints import build_checkpoint

    other = load_hf_model(build_checkpoint(tmp_path / "other", "qwen2", seed=11))
    params = SamplingParams(temperature=1.0, max_new_tokens=10)
    ids = prompt_ids(engine)
    try:
        engine.load_weights(other.state_dict())
        gen = engine.generate(ids, params, generator=torch.Generator().manual_seed(1))
        mask = gen.batch.response_mask
        to_new = (gen.log_probs.double() - reference_log_probs(other, gen)).abs()[mask]
        to_old = (gen.log_probs.double() - reference_log_probs(hf_model, gen)).abs()[mask]
        assert float(to_new.max()) < 1e-4  # the same prompts again: no stale prefix cache either
        assert float(to_old.mean()) > 0.1
    finally:
        engine.load_weights(hf_model.state_dict())
    gen = engine.generate(ids, params, generator=torch.Generator().manual_seed(1))
    back = (gen.log_probs.double() - reference_log_probs(hf_model, gen)).abs()[gen.batch.response_mask]
    assert float(back.max()) < 1e-4


def _top_k(k):
    return lambda probs: probs >= probs.topk(k).values[-1]


@pytest.mark.parametrize("params,keep", [
    (SamplingParams(top_k=3, max_new_tokens=10), _top_k(3)),
    (SamplingParams(min_p=0.2, max_new_tokens=10), lambda probs: probs >= 0.2 * probs.max()),
])
def test_top_k_and_min_p_sample_from_the_kept_tokens_with_their_renormalized_log_probs(engine, hf_model, params,
                                                                                       keep):
    gen = engine.generate(prompt_ids(engine), params, generator=torch.Generator().manual_seed(2))
    mask = gen.batch.response_mask
    diff = (gen.log_probs.double() - kept_reference_log_probs(hf_model, gen, keep)).abs()[mask]
    assert float(diff.max()) < 1e-4
    full = (gen.log_probs.double() - reference_log_probs(hf_model, gen)).abs()[mask]
    assert float(full.max()) > 1e-2  # the trainer's full-distribution log-probs differ on purpose


def test_a_stop_string_ends_the_completion_and_stays_in_it(engine):
    ids = prompt_ids(engine, 4)
    params = SamplingParams(max_new_tokens=12, stop=("+", "?", "="))
    gen = engine.generate(ids, params, generator=torch.Generator().manual_seed(3))
    texts = engine.decode_responses(gen)
    stopped = 0
    for text, length in zip(texts, gen.batch.response_mask.sum(1).tolist()):
        first = min((text.find(s) + len(s) for s in params.stop if s in text), default=None)
        if first is not None:
            stopped += 1
            assert not text[first:].strip(), f"text after the stop string: {text!r}"
    assert stopped > 0
    free = engine.generate(ids, SamplingParams(max_new_tokens=12), generator=torch.Generator().manual_seed(3))
    assert free.batch.response_mask.sum() > gen.batch.response_mask.sum()


def test_a_lora_payload_is_merged_into_the_checkpoint_weights(engine, qwen2_checkpoint):
    """What a --lora-rank trainer sends: the adapter only. The engine loads W_base + (B @ A) * scaling,
    always over the checkpoint's base weights, as ``merge_adapter`` does to a transformers model."""
    import json

    from relax.models.hf.lora import ADAPTER_CONFIG_KEY, merge_adapter

    def payload(seed):
        g = torch.Generator().manual_seed(seed)
        out = {}
        for layer in ("model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj"):
            weight = load_hf_model(qwen2_checkpoint).get_submodule(layer).weight
            out[f"{layer}.lora_A.weight"] = torch.randn(4, weight.shape[1], generator=g)
            out[f"{layer}.lora_B.weight"] = torch.randn(weight.shape[0], 4, generator=g)
        settings = {"r": 4, "lora_alpha": 8.0, "scaling": 2.0, "target_modules": ["q_proj", "down_proj"]}
        out[ADAPTER_CONFIG_KEY] = torch.tensor(list(json.dumps(settings).encode()), dtype=torch.uint8)
        return out

    params = SamplingParams(max_new_tokens=8)
    ids = prompt_ids(engine)
    reference = load_hf_model(qwen2_checkpoint)
    try:
        for seed in (0, 1):  # the second merge starts from the base again, not from the first merge
            engine.load_weights(payload(seed))
            merge_adapter(reference, payload(seed))
            gen = engine.generate(ids, params, generator=torch.Generator().manual_seed(4))
            diff = (gen.log_probs.double() - reference_log_probs(reference, gen)).abs()[gen.batch.response_mask]
            assert float(diff.max()) < 1e-4, seed
    finally:
        engine.load_weights(load_hf_model(qwen2_checkpoint).state_dict())
