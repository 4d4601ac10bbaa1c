"""Token-budget micro-batches and padding-free packing (``--max-tokens-per-micro-batch``).

The packed path must give the per-sample *unpadded* log-probs, and the padded path's losses and
gradients (to float rounding) for every loss aggregation, for GDPO's per-mini-batch whitening and
across two data-parallel ranks: the aggregations divide by the mini-batch's counts, never by a
micro-batch's, and the packed groups below have other sizes than the padded micro-batches."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from relax.algorithms import AdvantageInputs, AlgorithmConfig, get_algorithm
from relax.algorithms.gdpo import GDPO
from relax.algorithms.numerics.constants import LOSS_AGGREGATIONS
from relax.backends.torch_backend import TorchBackend
from relax.models.batch import TokenBatch
from relax.models.packing import plan_micro_batches
from relax.models.tiny.model import TinyCausalLM, TinyLMConfig
from relax.runtime.step.losses import policy_loss_fn

P_WIDTH, R_WIDTH, VOCAB = 5, 9, 17
BUDGET = 24  # tokens: the 12 samples below (2..12 tokens) pack into 5 micro-batches of 1-3 samples


def tiny_model(seed: int = 0) -> TinyCausalLM:
    torch.manual_seed(seed)
    model = TinyCausalLM(TinyLMConfig(max_seq_len=P_WIDTH + R_WIDTH))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return model


def qwen2_model(seed: int = 0):
    transformers = pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")
    from relax.models.hf.tiny_random import model_config

    torch.manual_seed(seed)
    model = transformers.Qwen2ForCausalLM(model_config("qwen2", VOCAB, hidden=64))
    return model


MODELS = {"tiny": tiny_model, "qwen2": qwen2_model}


def make_batch(n: int = 12, seed: int = 1, multi_turn: bool = True) -> TokenBatch:
    """Prompts of 1..5 tokens (left-padded), responses of 1..9 (right-padded); with ``multi_turn`` row 1
    holds an environment turn (attended to, outside the loss mask) and row 2 an all-masked response."""
    g = torch.Generator().manual_seed(seed)
    prompt_mask = torch.zeros(n, P_WIDTH, dtype=torch.bool)
    response_mask = torch.zeros(n, R_WIDTH, dtype=torch.bool)
    for i in range(n):
        prompt_mask[i, P_WIDTH - (1 + (i * 3) % P_WIDTH):] = True
        response_mask[i, : 1 + (i * 7) % R_WIDTH] = True
    attended = response_mask.clone()
    if multi_turn:
        response_mask[1, 2:4] = False  # the environment's turn inside row 1's response
        response_mask[2] = False  # a sample with no loss token (e.g. over-long filtered)
    prompt_ids = torch.randint(1, VOCAB, (n, P_WIDTH), generator=g) * prompt_mask
    response_ids = torch.randint(1, VOCAB, (n, R_WIDTH), generator=g) * attended
    return TokenBatch(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids,
                      response_mask=response_mask, response_attention_mask=attended if multi_turn else None)


def test_first_fit_decreasing_and_oversized_samples():
    plan = plan_micro_batches([5, 9, 3, 7, 12, 2], budget=12)
    # decreasing: 12 | 9 (+3) | 7 (+5) | then 2 fits next to 9+3? no (12 full) -> next to 7+5? no -> new
    assert plan.groups == ((4,), (1, 2), (0, 3), (5,))
    assert plan.oversized == 0 and plan.packed_tokens == 38
    plan = plan_micro_batches([30, 4, 4], budget=10)
    assert plan.groups == ((0,), (1, 2)) and plan.oversized == 1  # longer than the budget: alone, whole
    with pytest.raises(ValueError, match="--max-tokens-per-micro-batch"):
        plan_micro_batches([3], budget=0)


@pytest.mark.parametrize("family", sorted(MODELS))
def test_packed_log_probs_equal_the_unpadded_ones(family):
    model, batch = MODELS[family](), make_batch()
    out = TorchBackend(model, max_tokens_per_micro_batch=BUDGET).compute_log_probs(batch, with_entropy=True)
    attended = batch.attention_mask
    for i in range(len(batch)):
        seq = batch.input_ids[i][attended[i]]
        p = int(batch.prompt_mask[i].sum())
        with torch.no_grad():  # the sample alone: no padding, positions 0..len-1
            raw = model(input_ids=seq[None])
            logits = (raw if isinstance(raw, torch.Tensor) else raw.logits).double()[0]
        log_probs = torch.log_softmax(logits[p - 1 : -1], -1)
        ref = log_probs.gather(-1, seq[p:, None]).squeeze(-1)
        ref_entropy = -(log_probs.exp() * log_probs).sum(-1)
        mask = batch.response_mask[i][: len(ref)]
        torch.testing.assert_close(out.log_probs[i, : len(ref)].double(), ref * mask, rtol=0, atol=2e-5)
        torch.testing.assert_close(out.entropy[i, : len(ref)].double(), ref_entropy * mask, rtol=0, atol=2e-5)
        assert (out.log_probs[i, len(ref):] == 0).all()


def _loss_fn(algorithm, batch, old, adv):
    g = torch.Generator().manual_seed(5)
    mask = batch.response_mask
    return policy_loss_fn(
        algorithm, old_log_probs=old, advantages=adv, response_mask=mask,
        ref_log_probs=(old - 0.3 * torch.rand(old.shape, generator=g)) * mask,
        global_num_tokens=float(mask.sum()), global_num_sequences=float((mask.sum(1) > 0).sum()),
        max_response_length=R_WIDTH)


def _step(model_fn, batch, loss_fn, **backend_kw):
    """Gradients and metrics of one train_step (lr 0: the weights do not move)."""
    model = model_fn()
    micro = backend_kw.pop("micro_batch_size", None)
    metrics = TorchBackend(model, lr=0.0, clip_grad=None, **backend_kw).train_step(batch, loss_fn, micro_batch_size=micro)
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}, metrics


def _assert_same_step(padded, packed):
    (g_pad, m_pad), (g_pack, m_pack) = padded, packed
    assert {"loss", "pg_loss", "entropy", "grad_norm"} <= set(m_pad)
    for name in set(m_pad) - {"lr", "optimizer_state_mib"}:  # the loss, its terms and metrics, grad_norm
        assert m_pack[name] == pytest.approx(m_pad[name], rel=1e-5, abs=1e-6), name
    assert max_rel_diff(g_pack, g_pad) < 1e-5


def max_rel_diff(grads: dict, reference: dict) -> float:
    """max |g - g_ref| over all parameters, relative to max |g_ref| (float32 sums in another order)."""
    scale = max(float(g.abs().max()) for g in reference.values())
    return max(float((grads[n] - g).abs().max()) for n, g in reference.items()) / scale


def _old_and_advantages(batch, seed=3):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        old = TorchBackend(tiny_model()).compute_log_probs(batch).log_probs
    old = (old + 0.05 * torch.randn(old.shape, generator=g)) * batch.response_mask
    adv = torch.randn(len(batch), generator=g)[:, None].expand(-1, R_WIDTH) * batch.response_mask
    return old, adv


@pytest.mark.parametrize("aggregation", LOSS_AGGREGATIONS)
def test_every_aggregation_matches_the_padded_step(aggregation):
    batch = make_batch()
    old, adv = _old_and_advantages(batch)
    algorithm = get_algorithm("grpo")(AlgorithmConfig(loss_aggregation=aggregation, use_kl_loss=True,
                                                      kl_loss_coef=0.2, entropy_coef=0.01))
    loss_fn = _loss_fn(algorithm, batch, old, adv)
    padded = _step(tiny_model, batch, loss_fn, micro_batch_size=4)
    packed = _step(tiny_model, batch, loss_fn, max_tokens_per_micro_batch=BUDGET)
    assert packed[1]["micro_batches"] == 5 and packed[1]["packed_tokens"] == float(batch.attention_mask.sum())
    assert packed[1]["padded_tokens"] == float(batch.input_ids.numel())
    _assert_same_step(padded, packed)


def test_hf_qwen2_step_matches_the_padded_step():
    batch = make_batch()
    old, adv = _old_and_advantages(batch)
    algorithm = get_algorithm("grpo")(AlgorithmConfig(loss_aggregation="seq_mean_token_mean", use_kl_loss=True,
                                                      kl_loss_coef=0.2, entropy_coef=0.01))
    loss_fn = _loss_fn(algorithm, batch, old, adv)
    _assert_same_step(_step(qwen2_model, batch, loss_fn, micro_batch_size=3),
                      _step(qwen2_model, batch, loss_fn, max_tokens_per_micro_batch=BUDGET))


def test_gdpo_per_mini_batch_whitening_matches_the_padded_step():
    """Two mini-batches of 6: GDPO whitens each one; the packed micro-batches (other groupings than
    the padded ones) train on the same advantages and divide by the same counts."""
    batch = make_batch(multi_turn=False)
    g = torch.Generator().manual_seed(9)
    algo = GDPO(GDPO.Config(loss_aggregation="seq_mean_token_sum", reward_keys=("a", "b"), n_samples_per_prompt=2))
    rewards = torch.stack([torch.randn(12, generator=g), torch.randint(0, 3, (12,), generator=g).float()], 1)
    per_sample = algo.normalize_rewards(rewards, torch.arange(6).repeat_interleave(2))
    adv, _ = algo.compute_advantages(AdvantageInputs(rewards=per_sample, response_mask=batch.response_mask,
                                                     segment_sizes=[6, 6]))
    old, _ = _old_and_advantages(batch)
    for rows in (slice(0, 6), slice(6, 12)):
        sub = batch.select(rows)
        seq_adv = adv[rows].sum(1) / sub.response_mask.sum(1)  # one value per sample
        assert abs(float(seq_adv.mean())) < 1e-5 and len(set(seq_adv.tolist())) > 2  # whitened per mini-batch
        loss_fn = _loss_fn(algo, sub, old[rows], adv[rows])
        _assert_same_step(_step(tiny_model, sub, loss_fn, micro_batch_size=2),
                          _step(tiny_model, sub, loss_fn, max_tokens_per_micro_batch=14))


def _dp_worker(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        batch = make_batch()
        old, adv = _old_and_advantages(batch)
        algorithm = get_algorithm("grpo")(AlgorithmConfig(loss_aggregation="seq_mean_token_mean"))
        rows = slice(rank * 6, (rank + 1) * 6)
        whole = _loss_fn(algorithm, batch, old, adv)  # global counts of the whole mini-batch
        shard = batch.select(rows)

        def loss_fn(tlp, micro):  # the shard's micro-batch rows, as rows of the whole mini-batch
            return whole(tlp, torch.arange(12)[rows][micro])

        model = tiny_model()
        backend = TorchBackend(model, lr=0.0, clip_grad=None, process_group=dist.group.WORLD,
                               max_tokens_per_micro_batch=BUDGET)
        metrics = backend.train_step(shard, loss_fn)
        torch.save(({n: p.grad.clone() for n, p in model.named_parameters()}, metrics),
                   os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_two_gloo_ranks_packed_equal_the_padded_whole_batch(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_dp_worker, args=(r, port, str(tmp_path))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=100)
        if p.exitcode is None:
            p.kill()
        assert p.exitcode == 0, f"DP worker exited with {p.exitcode}"
    batch = make_batch()
    old, adv = _old_and_advantages(batch)
    algorithm = get_algorithm("grpo")(AlgorithmConfig(loss_aggregation="seq_mean_token_mean"))
    g_full, m_full = _step(tiny_model, batch, _loss_fn(algorithm, batch, old, adv), micro_batch_size=5)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    assert ranks[0][1]["loss"] + ranks[1][1]["loss"] == pytest.approx(m_full["loss"], rel=1e-5)
    for grads, metrics in ranks:
        assert metrics["grad_norm"] == pytest.approx(m_full["grad_norm"], rel=1e-5)
        assert max_rel_diff(grads, g_full) < 1e-5


def test_the_flag_is_refused_where_it_cannot_work():
    from relax.backends.registry import config_errors
    from relax.config.run import RunConfig

    errors = config_errors(RunConfig(backend="megatron", max_tokens_per_micro_batch=512))
    assert any("--max-tokens-per-micro-batch is implemented for --backend torch only" in e for e in errors)
    assert not any("max-tokens" in e for e in config_errors(RunConfig(max_tokens_per_micro_batch=512)))
    with pytest.raises(ValueError, match="critic trains on padded micro-batches"):
        TorchBackend(tiny_model(), value_head=True, max_tokens_per_micro_batch=64)
    with pytest.raises(ValueError, match="custom forward_logits"):
        TorchBackend(tiny_model(), forward_logits=lambda m, i, a, p: m(i, a, p), max_tokens_per_micro_batch=64)


def test_without_the_flag_the_padded_step_is_unchanged():
    """No budget: the padded micro-batches, bit for bit, and none of the packing metrics."""
    batch = make_batch()
    old, adv = _old_and_advantages(batch)
    loss_fn = _loss_fn(get_algorithm("grpo")(AlgorithmConfig()), batch, old, adv)
    grads, metrics = _step(tiny_model, batch, loss_fn, micro_batch_size=4)
    model = tiny_model()
    for start in range(0, 12, 4):  # the same micro-batches by hand
        rows = slice(start, start + 4)
        sub = batch.select(rows)
        logits = model(sub.input_ids, sub.attention_mask, sub.position_ids)
        from relax.models.batch import response_log_probs

        loss_fn(response_log_probs(logits, sub, with_entropy=True), rows).loss.backward()
    for name, p in model.named_parameters():
        assert torch.equal(p.grad, grads[name]), name
    assert "micro_batches" not in metrics


@pytest.mark.parametrize("variant", ["recompute", "lora"])
def test_hf_recompute_and_lora_packed_steps_match_the_padded_step(variant):
    """``--recompute-activations`` re-runs the layers in the backward pass (they must attend per sample
    there too); ``--lora-rank`` wraps the model in peft (the packed kwargs pass through it)."""
    from relax.backends.torch_setup import enable_recompute

    def model_fn():
        model = qwen2_model()
        if variant == "recompute":
            enable_recompute(model)
            return model
        pytest.importorskip("peft", reason="the lora extra (peft) is not installed")
        from relax.models.hf.lora import wrap_with_lora

        torch.manual_seed(1)
        model = wrap_with_lora(model, rank=4, alpha=8.0, dropout=0.0, target_modules=("all-linear",))
        with torch.no_grad():  # B = 0 at init: give the adapters a gradient on A too
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0.0, 0.1)
        return model

    from relax.models.hf.adapter import hf_forward_logits

    batch = make_batch()
    old, adv = _old_and_advantages(batch)
    loss_fn = _loss_fn(get_algorithm("grpo")(AlgorithmConfig()), batch, old, adv)
    kw = {"forward_logits": hf_forward_logits}
    padded = _step(model_fn, batch, loss_fn, micro_batch_size=4, **kw)
    packed = _step(model_fn, batch, loss_fn, max_tokens_per_micro_batch=BUDGET, **kw)
    _assert_same_step(padded, packed)
