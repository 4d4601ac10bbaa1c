"""The trainer's replay of truncated sampling (``relax.models.sampled_distribution``) against an
independent float64 reference written with Python loops, hand-computed cases (ties at the top-p
boundary, top-k with k >= V, min-p, temperature != 1), and the engines' own log-probs: the tiny engine
samples with top-p and the torch backend (padded and packed) must give the same log-probs."""

from __future__ import annotations

import math

import pytest
import torch

from relax.backends.torch_backend import TorchBackend
from relax.models.batch import TokenBatch, response_log_probs
from relax.models.sampled_distribution import Truncation, dropped_tokens, entropy_of, sampled_log_softmax
from relax.models.tiny.model import TinyCausalLM, TinyLMConfig
from relax.models.tiny.tokenizer import TinyTokenizer
from relax.rollout.base import SamplingParams
from relax.rollout.hf.engine import top_p_filter
from relax.rollout.tiny.engine import TinyEngine, sampling_log_probs

# -- the independent reference: one row, Python floats (float64), loops ------------------------------


def reference_kept(scores: list[float], temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, sampled=None) -> list[bool]:
    """The kept set of one row, the rule written out: temperature, min-p, top-k, top-p (ties in token
    order), the sampled token always kept."""
    s = [x / temperature for x in scores]
    v = len(s)
    kept = [True] * v
    if min_p > 0:
        m = max(s)
        z = sum(math.exp(x - m) for x in s)
        p = [math.exp(x - m) / z for x in s]
        kept = [p[i] >= min_p * max(p) for i in range(v)]
    if 0 < top_k < v:
        survivors = sorted((s[i] for i in range(v) if kept[i]), reverse=True)
        if len(survivors) >= top_k:
            kth = survivors[top_k - 1]
            kept = [kept[i] and s[i] >= kth for i in range(v)]
    if top_p < 1:
        ids = [i for i in range(v) if kept[i]]
        m = max(s[i] for i in ids)
        z = sum(math.exp(s[i] - m) for i in ids)
        order = sorted(ids, key=lambda i: (-s[i], i))
        mass, new = 0.0, [False] * v
        for rank, i in enumerate(order):
            if rank == 0 or mass < top_p:
                new[i] = True
            mass += math.exp(s[i] - m) / z
        kept = new
    if sampled is not None:
        kept[sampled] = True
    return kept


def reference_log_prob(scores, token, **rule) -> float:
    kept = reference_kept(scores, sampled=token, **rule)
    s = [x / rule.get("temperature", 1.0) for x in scores]
    m = max(s[i] for i in range(len(s)) if kept[i])
    z = sum(math.exp(s[i] - m) for i in range(len(s)) if kept[i])
    return s[token] - m - math.log(z)


# -- hand-computed cases ------------------------------------------------------------------------


def _lp(probs, token, truncation, temperature=1.0):
    scores = torch.log(torch.tensor([probs], dtype=torch.float64)).float() / temperature
    return float(sampled_log_softmax(scores, truncation, torch.tensor([token]))[0, token])


def test_top_p_ties_at_the_boundary_break_in_token_order():
    # sorted: 0.3 (id 0), then three tokens at 0.2 in id order 1, 2, 3, then 0.1; top-p 0.45: after
    # 0.3 + 0.2 = 0.5 >= 0.45 the mass is reached, so of the tied tokens only id 1 stays
    probs = [0.3, 0.2, 0.2, 0.2, 0.1]
    scores = torch.log(torch.tensor([probs]))
    drop = dropped_tokens(scores, Truncation(top_p=0.45))
    assert drop.tolist() == [[False, False, True, True, True]]
    assert _lp(probs, 1, Truncation(top_p=0.45)) == pytest.approx(math.log(0.2 / 0.5), abs=1e-6)
    # the engines use the same rule: same kept set from the tiny and hf engines' filters
    assert torch.isinf(sampling_log_probs(scores, 1.0, 0.45)).tolist() == drop.tolist()
    assert torch.isinf(top_p_filter(scores, 0.45)).tolist() == drop.tolist()

    # many tied tokens (a sort that is not stable reorders them): 0.3 then 199 tokens of 0.7/199 each;
    # top-p 0.5 keeps the tied tokens of rank r < 0.2 * 199 / 0.7 = 56.9, i.e. ids 1..57
    probs = torch.tensor([[0.3] + [0.7 / 199] * 199], dtype=torch.float64)
    scores = torch.log(probs).float()
    assert scores[0, 1:].unique().numel() == 1  # exactly tied in float32
    kept = (~dropped_tokens(scores, Truncation(top_p=0.5)))[0].nonzero().flatten().tolist()
    assert kept == list(range(58))
    assert torch.isfinite(sampling_log_probs(scores, 1.0, 0.5))[0].nonzero().flatten().tolist() == kept
    assert torch.isfinite(top_p_filter(scores, 0.5))[0].nonzero().flatten().tolist() == kept


def test_the_sampled_token_always_stays():
    # token 3 is outside the nucleus {0, 1}; had it been sampled, it joins the kept set
    probs = [0.3, 0.2, 0.2, 0.2, 0.1]
    assert _lp(probs, 3, Truncation(top_p=0.45)) == pytest.approx(math.log(0.2 / 0.7), abs=1e-6)


def test_top_k_at_or_above_the_vocabulary_keeps_everything_and_ties_with_the_kth_stay():
    probs = [0.1, 0.4, 0.2, 0.2, 0.1]
    for k in (5, 6, 100):
        assert _lp(probs, 0, Truncation(top_k=k)) == pytest.approx(math.log(0.1), abs=1e-6)
    # k = 2: the 2nd largest is 0.2, held by ids 2 and 3: both stay -> {1, 2, 3}, mass 0.8
    assert _lp(probs, 1, Truncation(top_k=2)) == pytest.approx(math.log(0.4 / 0.8), abs=1e-6)
    assert _lp(probs, 1, Truncation(top_k=1)) == pytest.approx(0.0, abs=1e-6)


def test_min_p_drops_below_a_fraction_of_the_top_probability():
    # threshold 0.1 * 0.5 = 0.05: token 2 (0.04) goes, the rest (mass 0.96) stay
    probs = [0.5, 0.3, 0.04, 0.16]
    assert _lp(probs, 3, Truncation(min_p=0.1)) == pytest.approx(math.log(0.16 / 0.96), abs=1e-6)


def test_temperature_comes_before_the_truncation():
    # T = 2 flattens p = (.64, .16, .04, .16) to (.8, .4, .2, .4) / 1.8; top-p 0.6 then keeps {0, 1}
    # (0.444 + 0.222 reaches 0.6); at T = 1 it would keep only token 0 (0.64 >= 0.6)
    probs = [0.64, 0.16, 0.04, 0.16]
    assert _lp(probs, 0, Truncation(top_p=0.6), temperature=2.0) == pytest.approx(math.log(2 / 3), abs=1e-6)
    assert _lp(probs, 0, Truncation(top_p=0.6), temperature=1.0) == pytest.approx(0.0, abs=1e-6)


# -- random rows against the reference ------------------------------------------------------------


@pytest.mark.parametrize("rule", [
    dict(top_p=0.7), dict(top_k=3), dict(top_k=40), dict(min_p=0.2), dict(temperature=0.6, top_p=0.5),
    dict(temperature=1.7, top_k=4, top_p=0.8, min_p=0.05),
])
def test_random_rows_match_the_float64_reference(rule):
    g = torch.Generator().manual_seed(11)
    scores = torch.randn(64, 12, generator=g, dtype=torch.float64) * 2
    scores[:8, 5] = scores[:8, 2]  # exact ties in some rows
    tokens = torch.randint(0, 12, (64,), generator=g)
    temperature = rule.get("temperature", 1.0)
    truncation = Truncation(**{k: v for k, v in rule.items() if k != "temperature"})
    got = sampled_log_softmax(scores.float() / temperature, truncation, tokens)
    for row in range(64):
        s = scores[row].float().double().tolist()
        want = reference_log_prob(s, int(tokens[row]), **rule)
        assert float(got[row, tokens[row]]) == pytest.approx(want, abs=2e-5)


def test_entropy_and_gradients_of_the_truncated_distribution_are_finite():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]], dtype=torch.float64)
    logits = torch.log(probs).float().requires_grad_(True)
    lp = sampled_log_softmax(logits, Truncation(top_p=0.75), torch.tensor([0]))
    entropy = entropy_of(lp)
    kept = torch.tensor([0.5, 0.3]) / 0.8
    assert float(entropy.detach()) == pytest.approx(float(-(kept * kept.log()).sum()), abs=1e-6)
    (entropy + lp[0, 0]).sum().backward()
    assert torch.isfinite(logits.grad).all() and logits.grad[0, 2:].abs().max() == 0.0


def test_no_truncation_is_the_plain_log_softmax():
    scores = torch.randn(3, 7)
    assert torch.equal(sampled_log_softmax(scores, None), torch.log_softmax(scores, dim=-1))
    assert torch.equal(sampled_log_softmax(scores, Truncation()), torch.log_softmax(scores, dim=-1))


# -- the engine's log-probs equal the trainer's -------------------------------------------------------


@pytest.mark.parametrize("packed", [False, True])
def test_the_trainer_reproduces_the_tiny_engines_top_p_log_probs(packed):
    torch.manual_seed(0)
    model = TinyCausalLM(TinyLMConfig())
    tok = TinyTokenizer()
    prompts = [tok.encode(p) for p in ("<bos>2+2=", "<bos>13+5=", "<bos>7+8=", "<bos>1+1=")] * 2
    params = SamplingParams(temperature=0.8, top_p=0.7, max_new_tokens=6)
    gen = TinyEngine(model).generate(prompts, params, torch.Generator().manual_seed(4))
    batch: TokenBatch = gen.batch
    mask = batch.response_mask

    def trainer(truncation):
        backend = TorchBackend(model, temperature=0.8, truncation=truncation,
                               max_tokens_per_micro_batch=40 if packed else None)
        return backend.compute_log_probs(batch, with_entropy=True)

    replayed = trainer(Truncation(top_p=0.7))
    assert float((replayed.log_probs - gen.log_probs).abs()[mask].max()) < 1e-5
    assert torch.isfinite(replayed.entropy).all()
    full = trainer(None)  # the full vocabulary: every token scores below the engine (its kept mass < 1)
    gap = (gen.log_probs - full.log_probs)[mask]
    assert float(gap.min()) > -1e-5 and float(gap.mean()) > 0.05
    # the reference-pass helper agrees with the backend
    with torch.no_grad():
        logits = model(batch.input_ids, batch.attention_mask, batch.position_ids)
    direct = response_log_probs(logits, batch, with_entropy=False, temperature=0.8, truncation=Truncation(top_p=0.7))
    assert float((direct.log_probs - gen.log_probs).abs()[mask].max()) < 1e-5


# -- the switch's rule --------------------------------------------------------------------------------


def test_the_full_vocabulary_switch_warns_when_sampling_truncates_nothing():
    from relax.algorithms import AlgorithmConfig, get_algorithm
    from relax.config.run import RunConfig
    from relax.runtime.checks.no_op_rules import check_no_op

    def warnings_of(**run):
        errors, warnings = [], []
        config = RunConfig(algorithm=AlgorithmConfig(full_vocabulary_log_probs=True), **run)
        check_no_op(config, get_algorithm("grpo"), "grpo", errors, warnings)
        assert errors == []
        return warnings

    assert any("--full-vocabulary-log-probs has no effect" in w for w in warnings_of())
    for truncating in (dict(rollout_top_p=0.9), dict(rollout_top_k=5), dict(rollout_min_p=0.1)):
        assert not any("--full-vocabulary-log-probs" in w for w in warnings_of(**truncating))
        assert Truncation.of_run(RunConfig(**truncating)) is not None
        assert Truncation.of_run(RunConfig(algorithm=AlgorithmConfig(full_vocabulary_log_probs=True),
                                           **truncating)) is None
    assert Truncation.of_run(RunConfig()) is None


def test_positions_decided_in_chunks_give_the_same_kept_sets(monkeypatch):
    import relax.models.sampled_distribution as sampled_distribution

    g = torch.Generator().manual_seed(3)
    scores, tokens = torch.randn(3, 50, 300, generator=g), torch.randint(0, 300, (3, 50), generator=g)
    rule = Truncation(top_k=7, min_p=0.01, top_p=0.9)
    whole = dropped_tokens(scores, rule, tokens)
    monkeypatch.setattr(sampled_distribution, "_CHUNK_ELEMENTS", 7 * 300 + 5)  # 7 positions a chunk, 22 chunks
    assert torch.equal(dropped_tokens(scores, rule, tokens), whole)
    assert 0 < int(whole.sum()) < whole.numel()
    assert dropped_tokens(torch.zeros(0, 5, 9), rule).shape == (0, 5, 9)


def test_the_tiny_engine_samples_with_top_k_and_min_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.04, 0.16]]))
    kept = lambda **rule: torch.isfinite(sampling_log_probs(logits, 1.0, **rule))[0].tolist()  # noqa: E731
    assert kept(top_p=1.0, top_k=2) == [True, True, False, False]
    assert kept(top_p=1.0, min_p=0.1) == [True, True, False, True]  # 0.04 < 0.1 * 0.5
    assert kept(top_p=0.7, top_k=3, min_p=0.1) == [True, True, False, False]  # (0.5 + 0.3) / 0.96 reaches 0.7
    assert torch.equal(sampling_log_probs(logits, 1.0, 1.0, 0, 0.0), torch.log_softmax(logits, dim=-1))
