"""The built-in tiny causal LM, tokenizer and KV-cached sampling engine."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from relax.models.batch import TokenBatch
from relax.rollout.base import SamplingParams
from relax.rollout.tiny.engine import TinyEngine, left_pad, sampling_log_probs
from relax.models.tiny.model import KVCache, TinyCausalLM, TinyLMConfig
from relax.models.tiny.tokenizer import TinyTokenizer
from relax.models.tiny.weights import CHECKPOINT, load_warmup_model, warmup_base_rates
from relax.recipes.warmup import measure_base_rates, train_warmup

TOK = TinyTokenizer()


def random_model(seed: int = 0, **config) -> TinyCausalLM:
    torch.manual_seed(seed)
    model = TinyCausalLM(TinyLMConfig(**config))
    # Larger-than-init weights so that logits differ clearly between positions.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return model.eval()


def test_tokenizer_round_trip_and_errors():
    text = "<bos>7+8=<a>15</a><eos><pad>"
    ids = TOK.encode(text)
    assert ids == [1, 10, 13, 11, 14, 15, 4, 8, 16, 2, 0]
    assert TOK.decode(ids) == text
    assert TOK.decode(ids, skip_pad=True) == "<bos>7+8=<a>15</a><eos>"
    assert TOK.encode(" <a> 1 </a> ") == [15, 4, 16]
    assert len(TOK.vocab) == 17 and TOK.vocab_size == 17
    with pytest.raises(ValueError, match="'x' at position 5"):
        TOK.encode("<bos>x")
    with pytest.raises(ValueError, match="outside the tiny vocabulary"):
        TOK.decode([17])


def test_parameter_names_and_count():
    model = TinyCausalLM()
    names = list(model.state_dict())
    assert names[:2] == ["tok_emb.weight", "pos_emb.weight"]
    assert "blocks.1.mlp.fc_out.bias" in names and not any("lm_head" in n for n in names)
    # d=64, 2 layers, MLP 4x, 17 tokens, 16 positions (see the module docstring)
    assert model.num_parameters() == 102208


def test_kv_cached_decoding_matches_full_forward():
    model = random_model()
    ids, mask = left_pad([TOK.encode("<bos>3+4="), TOK.encode("<bos>9+9=<a>"), TOK.encode("5+")], TOK.pad_id)
    extra = torch.tensor([[15, 4, 16], [3, 16, 2], [14, 7, 7]])
    full_ids = torch.cat([ids, extra], 1)
    full_mask = torch.cat([mask, torch.ones_like(extra, dtype=torch.bool)], 1)
    positions = (full_mask.long().cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        reference = model(full_ids, full_mask, positions)
        cache = KVCache(model.config, 3, full_ids.shape[1])
        p = ids.shape[1]
        step_logits = [model(ids, mask, positions[:, :p], kv_cache=cache)[0][:, -1]]
        for j in range(extra.shape[1]):
            col = p + j
            out, _ = model(full_ids[:, col : col + 1], full_mask[:, : col + 1], positions[:, col : col + 1], kv_cache=cache)
            step_logits.append(out[:, -1])
    for j, logits in enumerate(step_logits):
        torch.testing.assert_close(logits, reference[:, p - 1 + j], rtol=1e-5, atol=1e-5)


def test_engine_log_probs_match_full_forward():
    model = random_model(1)
    engine = TinyEngine(model)
    prompts = [TOK.encode("<bos>1+2="), TOK.encode("3+"), TOK.encode("<bos>9+9=<a>1")]
    gen = engine.generate(prompts, SamplingParams(max_new_tokens=6), torch.Generator().manual_seed(0))
    b = gen.batch
    with torch.no_grad():
        logits = model(b.input_ids, b.attention_mask, b.position_ids)
    p = b.prompt_width
    lp = torch.log_softmax(logits[:, p - 1 : -1].double(), -1).gather(-1, b.response_ids[..., None]).squeeze(-1)
    lp = lp * b.response_mask
    torch.testing.assert_close(gen.log_probs.double(), lp, rtol=0, atol=2e-5)
    assert (gen.log_probs[~b.response_mask] == 0).all()


def test_left_padding_invariance():
    model = random_model(2)
    prompt = TOK.encode("<bos>4+5=")
    with torch.no_grad():
        alone = model(torch.tensor([prompt]))[:, -1]
        ids, mask = left_pad([prompt, TOK.encode("<bos>1+1=<a>1</a>")], TOK.pad_id)  # row 0 gets 3 pads
        batch = TokenBatch(prompt_ids=ids, prompt_mask=mask, response_ids=ids[:, :0], response_mask=mask[:, :0])
        padded = model(ids, mask, batch.position_ids)[0:1, -1]
        # garbage in the pad slots must not matter either
        ids2 = ids.clone()
        ids2[0, :3] = torch.tensor([7, 15, 2])
        garbage = model(ids2, mask, batch.position_ids)[0:1, -1]
    assert mask[0].tolist() == [False] * 3 + [True] * 5
    torch.testing.assert_close(padded, alone, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(garbage, alone, rtol=1e-5, atol=1e-5)


class EosAfter(TinyCausalLM):
    """Puts a huge logit on <eos> from absolute position ``stop_at`` on, so stops are known."""

    stop_at = 6

    def forward(self, input_ids, attention_mask=None, position_ids=None, kv_cache=None):
        out = super().forward(input_ids, attention_mask, position_ids, kv_cache)
        logits = out[0] if isinstance(out, tuple) else out
        logits[..., TOK.eos_id] += 100.0 * (position_ids >= self.stop_at - 1)
        logits[..., TOK.eos_id] -= 100.0 * (position_ids < self.stop_at - 1)
        return out


def test_eos_stops_each_row_and_masks_the_rest():
    torch.manual_seed(0)
    engine = TinyEngine(EosAfter(TinyLMConfig()).eval())
    # <eos> is forced at absolute position 6: a 5-token prompt gets 1 token before it, a 2-token one 4.
    prompts = [TOK.encode("<bos>1+2="), TOK.encode("<bos>1+"), TOK.encode("1+")]
    gen = engine.generate(prompts, SamplingParams(max_new_tokens=8), torch.Generator().manual_seed(0))
    b = gen.batch
    lengths = b.response_mask.sum(1).tolist()
    assert lengths == [2, 4, 5]
    assert b.response_ids.shape[1] == 5  # stopped early: the longest row, not max_new_tokens
    for row, n in enumerate(lengths):
        assert b.response_ids[row, n - 1] == TOK.eos_id
        assert (b.response_ids[row, :n - 1] != TOK.eos_id).all()
        assert (b.response_ids[row, n:] == TOK.pad_id).all()
        assert (gen.log_probs[row, n:] == 0).all()
        assert b.response_mask[row, :n].all() and not b.response_mask[row, n:].any()
    texts = engine.decode_responses(gen)
    assert all(t.endswith("<eos>") for t in texts)


def test_rows_without_eos_run_to_max_new_tokens():
    model = EosAfter(TinyLMConfig()).eval()
    model.stop_at = 100  # never
    gen = TinyEngine(model).generate([TOK.encode("<bos>1+2=")] * 3, SamplingParams(max_new_tokens=4))
    assert gen.batch.response_ids.shape == (3, 4) and gen.batch.response_mask.all()
    assert (gen.batch.response_ids != TOK.eos_id).all()


def test_top_p_nucleus():
    logits = torch.log(torch.tensor([[0.05, 0.5, 0.15, 0.3]]))
    lp = sampling_log_probs(logits, 1.0, 0.7)
    assert torch.isinf(lp[0, [0, 2]]).all()  # 0.5 + 0.3 >= 0.7: {1, 3} is the nucleus
    torch.testing.assert_close(lp[0, [1, 3]].exp(), torch.tensor([0.5 / 0.8, 0.3 / 0.8]))
    lp = sampling_log_probs(logits, 1.0, 0.81)
    assert torch.isfinite(lp[0, [1, 2, 3]]).all() and torch.isinf(lp[0, 0])
    # temperature 2 flattens: p ~ sqrt(p)
    t2 = sampling_log_probs(logits, 2.0, 1.0).exp()
    torch.testing.assert_close(t2, torch.tensor([[0.05, 0.5, 0.15, 0.3]]).sqrt() / torch.tensor([0.05, 0.5, 0.15, 0.3]).sqrt().sum())


def test_top_p_tiny_equals_greedy_and_restricts_support():
    model = random_model(3)
    engine = TinyEngine(model)
    prompts = [TOK.encode("<bos>2+2="), TOK.encode("<bos>8+5=")] * 4
    greedy = engine.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=6))
    nucleus = engine.generate(prompts, SamplingParams(top_p=1e-6, max_new_tokens=6), torch.Generator().manual_seed(5))
    assert torch.equal(greedy.batch.response_ids, nucleus.batch.response_ids)
    assert torch.equal(nucleus.log_probs, torch.zeros_like(nucleus.log_probs))  # a one-token nucleus has prob 1
    loose = engine.generate(prompts, SamplingParams(top_p=1.0, max_new_tokens=6), torch.Generator().manual_seed(5))
    assert not torch.equal(loose.batch.response_ids, greedy.batch.response_ids)


def test_sampling_is_deterministic_given_a_generator():
    engine = TinyEngine(random_model(4))
    prompts = [TOK.encode("<bos>3+3=")] * 16
    a = engine.generate(prompts, SamplingParams(), torch.Generator().manual_seed(7))
    b = engine.generate(prompts, SamplingParams(), torch.Generator().manual_seed(7))
    c = engine.generate(prompts, SamplingParams(), torch.Generator().manual_seed(8))
    assert torch.equal(a.batch.response_ids, b.batch.response_ids) and torch.equal(a.log_probs, b.log_probs)
    assert not torch.equal(a.batch.response_ids, c.batch.response_ids)


def test_bad_sampling_params_are_rejected():
    engine = TinyEngine(random_model())
    with pytest.raises(ValueError, match="top_p"):
        engine.generate([[1]], SamplingParams(top_p=0.0))
    with pytest.raises(ValueError, match="max_seq_len=16"):
        engine.generate([[1] * 10], SamplingParams(max_new_tokens=8))


def test_load_weights_round_trip():
    engine = TinyEngine(random_model(5))
    source = random_model(6)
    engine.load_weights(source.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(engine.model.state_dict().values(), source.state_dict().values()))


def test_shipped_warmup_checkpoint():
    assert CHECKPOINT.stat().st_size < 1_000_000
    model = load_warmup_model()
    recorded = warmup_base_rates()
    measured = measure_base_rates(model)
    for key, value in recorded.items():
        assert abs(measured[key] - value) < 0.02, (key, value, measured[key])
    # mid-range: what RL needs to explore from (docs/en/embedded-default.md)
    assert 0.05 < recorded["correct"] < 0.35 and 0.25 < recorded["format"] < 0.75


def test_warmup_is_deterministic():
    a, b = train_warmup(steps=3), train_warmup(steps=3)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_missing_checkpoint_error(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="python -m relax.recipes.warmup"):
        load_warmup_model(tmp_path / "nope.pt")
