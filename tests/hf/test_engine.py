import math

import pytest
import torch

from relax.rollout.base import SamplingParams
from relax.models.hf import HFTokenizer, load_hf_model, load_hf_tokenizer
from relax.rollout.hf import HFEngine, top_p_filter
from relax.rollout.hf.engine import sample_categorical

PROMPTS = ["what is 3 + 4 ?", "hello", "add the numbers 1 and 2 please", "yes"]


def make_engine(path, **tok_kwargs):
    tok = load_hf_tokenizer(path)
    if tok_kwargs:
        tok = HFTokenizer(tok.hf, **tok_kwargs)
    return HFEngine(load_hf_model(path), tok)


def encode_all(tok, n_repeat=2):
    return [tok.encode(p) for p in PROMPTS] * n_repeat


def unpadded_reference_log_probs(model, gen, temperature=1.0, top_p=1.0):
    """Per row, a plain forward over the row's real tokens only (no padding, no cache), then the
    log-prob of each response token under softmax(logits / T) restricted to the top-p nucleus."""
    b = gen.batch
    out = torch.zeros_like(gen.log_probs)
    for i in range(len(b)):
        prompt = b.prompt_ids[i][b.prompt_mask[i]]
        response = b.response_ids[i][b.response_mask[i]]
        ids = torch.cat([prompt, response])[None]
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0].double() / temperature
        for t, tok in enumerate(response.tolist()):
            probs = torch.softmax(logits[len(prompt) + t - 1], dim=-1)
            sorted_p, order = probs.sort(descending=True)
            keep = int((sorted_p.cumsum(0) < top_p).sum()) + 1  # smallest prefix reaching top_p
            nucleus = order[:keep].tolist()
            assert tok in nucleus, f"row {i} token {t}: sampled {tok} outside the top-p nucleus {nucleus}"
            out[i, t] = math.log(probs[tok] / probs[nucleus].sum())
    return out


def check_layout(gen, tok, max_new_tokens):
    b = gen.batch
    n = len(b)
    assert b.response_ids.shape == gen.log_probs.shape == b.response_mask.shape
    assert b.response_ids.shape[1] <= max_new_tokens
    assert b.prompt_mask[:, -1].all()  # left-padded: every prompt ends at column P - 1
    stop = torch.tensor(tok.stop_ids)
    for i in range(n):
        length = int(b.response_mask[i].sum())
        assert b.response_mask[i, :length].all() and not b.response_mask[i, length:].any()  # right-padded
        assert (b.response_ids[i, length:] == tok.pad_id).all()
        assert (gen.log_probs[i, length:] == 0).all()
        assert (gen.log_probs[i, :length] < 0).all()
        real = b.response_ids[i, :length]
        is_stop = torch.isin(real, stop)
        # A response ends at its first stop token (kept, masked in) or at max_new_tokens.
        assert not is_stop[:-1].any()
        assert bool(is_stop[-1]) or length == max_new_tokens


def test_shapes_masks_and_eos(checkpoints, family):
    path = checkpoints[family]
    tok0 = load_hf_tokenizer(path)
    # Half the vocabulary ends a response, so most rows stop early and at different lengths.
    engine = make_engine(path, extra_stop_ids=range(3, tok0.vocab_size, 2))
    prompts = encode_all(engine.tokenizer, 4)
    gen = engine.generate(prompts, SamplingParams(max_new_tokens=10), torch.Generator().manual_seed(3))
    check_layout(gen, engine.tokenizer, 10)
    lengths = gen.batch.response_mask.sum(1)
    assert lengths.min() < lengths.max()  # rows stopped at different times
    assert (gen.batch.prompt_mask.sum(1) == torch.tensor([len(p) for p in prompts])).all()


def test_eos_only_stopping_and_full_length_rows(checkpoints):
    engine = make_engine(checkpoints["qwen2"])
    prompts = encode_all(engine.tokenizer, 4)
    gen = engine.generate(prompts, SamplingParams(max_new_tokens=24), torch.Generator().manual_seed(0))
    check_layout(gen, engine.tokenizer, 24)
    lengths = gen.batch.response_mask.sum(1)
    assert (lengths == 24).any()  # some rows never emitted EOS


def test_same_seed_same_output_and_different_seed_differs(checkpoints):
    engine = make_engine(checkpoints["llama"])
    prompts = encode_all(engine.tokenizer)
    params = SamplingParams(max_new_tokens=8, temperature=0.9, top_p=0.95)
    a = engine.generate(prompts, params, torch.Generator().manual_seed(11))
    b = engine.generate(prompts, params, torch.Generator().manual_seed(11))
    c = engine.generate(prompts, params, torch.Generator().manual_seed(12))
    assert torch.equal(a.batch.response_ids, b.batch.response_ids)
    assert torch.equal(a.log_probs, b.log_probs)
    assert not torch.equal(a.batch.response_ids, c.batch.response_ids)


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 1.0), (1.3, 0.8)])
def test_sampling_log_probs_equal_an_unpadded_plain_forward(checkpoints, family, temperature, top_p):
    engine = make_engine(checkpoints[family])
    gen = engine.generate(
        encode_all(engine.tokenizer),
        SamplingParams(max_new_tokens=8, temperature=temperature, top_p=top_p),
        torch.Generator().manual_seed(5),
    )
    ref = unpadded_reference_log_probs(engine.model, gen, temperature, top_p)
    torch.testing.assert_close(gen.log_probs, ref, atol=2e-5, rtol=0)


def test_greedy_matches_argmax_of_a_plain_forward(checkpoints):
    engine = make_engine(checkpoints["qwen3"])
    gen = engine.generate(encode_all(engine.tokenizer, 1), SamplingParams(temperature=0.0, max_new_tokens=6))
    b = gen.batch
    with torch.no_grad():
        logits = engine.model(
            input_ids=b.input_ids, attention_mask=b.attention_mask.long(), position_ids=b.position_ids
        ).logits
    greedy = logits[:, b.prompt_width - 1 : -1].argmax(-1)
    assert torch.equal(b.response_ids[b.response_mask], greedy[b.response_mask])
    assert (gen.log_probs == 0).all()  # a point mass


def test_sample_categorical_draws_the_given_distribution():
    probs = torch.tensor([0.5, 0.0, 0.3, 0.15, 0.05, 0.0])
    n = 40_000
    log_probs = torch.log(probs).expand(n, -1)
    draws = sample_categorical(log_probs, torch.Generator().manual_seed(0))
    counts = torch.bincount(draws, minlength=6).double()
    assert counts[1] == 0 and counts[5] == 0  # zero-probability tokens (e.g. outside top-p) never drawn
    expected = probs.double() * n
    sigma = (n * probs.double() * (1 - probs.double())).sqrt()
    nonzero = probs > 0
    assert ((counts[nonzero] - expected[nonzero]).abs() < 4 * sigma[nonzero]).all(), counts
    # seeded -> reproducible
    again = sample_categorical(log_probs, torch.Generator().manual_seed(0))
    assert torch.equal(draws, again)


def test_top_p_filter_hand_computed():
    logits = torch.log(torch.tensor([[0.15, 0.5, 0.05, 0.3]]))
    kept = lambda p: torch.isfinite(top_p_filter(logits, p))[0].tolist()
    assert kept(1.0) == [True, True, True, True]
    assert kept(0.75) == [False, True, False, True]  # 0.5 + 0.3 reaches 0.75
    assert kept(0.85) == [True, True, False, True]
    assert kept(0.1) == [False, True, False, False]  # the top token always stays


def test_load_weights_changes_the_distribution_and_checks_names(checkpoints):
    engine = make_engine(checkpoints["llama"])
    other = load_hf_model(checkpoints["qwen2"])  # different architecture: names / shapes differ
    donor = load_hf_model(checkpoints["llama-tied"]).state_dict()
    ids = torch.tensor([engine.tokenizer.encode("hello world")])
    before = engine.model(input_ids=ids).logits
    weights = {k: v for k, v in load_hf_model(checkpoints["llama"]).state_dict().items()}
    weights = {k: v * 1.5 if k.endswith("embed_tokens.weight") else v for k, v in weights.items()}
    engine.load_weights(weights)
    after = engine.model(input_ids=ids).logits
    assert not torch.allclose(before, after)
    reference = load_hf_model(checkpoints["llama"])
    reference.load_state_dict(weights)
    torch.testing.assert_close(after, reference(input_ids=ids).logits, atol=0, rtol=0)
    with pytest.raises(KeyError, match="missing"):
        engine.load_weights({f"model.{k}": v for k, v in weights.items()})
    with pytest.raises((KeyError, ValueError)):
        engine.load_weights(other.state_dict())
    assert "lm_head.weight" in donor


@pytest.mark.parametrize(
    "params,match",
    [
        (SamplingParams(temperature=-1.0), "temperature"),
        (SamplingParams(top_p=0.0), "top-p"),
        (SamplingParams(max_new_tokens=0), "max-response-len"),
    ],
)
def test_bad_sampling_params(checkpoints, params, match):
    engine = make_engine(checkpoints["llama"])
    with pytest.raises(ValueError, match=match):
        engine.generate([[1, 5]], params)


def test_empty_prompt_is_rejected(checkpoints):
    engine = make_engine(checkpoints["llama"])
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        engine.generate([[1, 5], []], SamplingParams())
