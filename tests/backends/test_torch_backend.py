"""TorchBackend: log-probs, entropy, micro-batching, clipping, exact resume, gloo data parallelism."""

from __future__ import annotations

import math
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from relax.algorithms.types import PolicyLossOutput
from relax.models.batch import TokenBatch
from relax.backends.torch_backend import TorchBackend
from relax.models.tiny.model import TinyCausalLM, TinyLMConfig


def make_model(seed: int = 0) -> TinyCausalLM:
    torch.manual_seed(seed)
    model = TinyCausalLM(TinyLMConfig())
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return model


def make_batch(n: int = 8, seed: int = 1) -> TokenBatch:
    """Prompts of 2..5 tokens (left-padded), responses of 1..6 tokens (right-padded)."""
    g = torch.Generator().manual_seed(seed)
    p_width, r_width = 5, 6
    prompt_ids = torch.zeros(n, p_width, dtype=torch.long)
    prompt_mask = torch.zeros(n, p_width, dtype=torch.bool)
    response_ids = torch.zeros(n, r_width, dtype=torch.long)
    response_mask = torch.zeros(n, r_width, dtype=torch.bool)
    for i in range(n):
        lp = 2 + i % 4
        lr = 1 + (i * 5) % r_width
        prompt_ids[i, p_width - lp:] = torch.randint(1, 17, (lp,), generator=g)
        prompt_mask[i, p_width - lp:] = True
        response_ids[i, :lr] = torch.randint(1, 17, (lr,), generator=g)
        response_mask[i, :lr] = True
    return TokenBatch(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids, response_mask=response_mask)


def advantages_for(batch: TokenBatch) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    return torch.randn(batch.response_ids.shape, generator=g) * batch.response_mask


def weighted_loss(batch: TokenBatch, adv: torch.Tensor, global_tokens: float):
    """loss = -sum(adv * logp) / global token count (+ 0.01 * entropy), normalized globally."""

    def loss_fn(lp, rows):
        mask = batch.response_mask[rows]
        loss = -(adv[rows] * lp.log_probs * mask).sum() / global_tokens
        loss = loss - 0.01 * (lp.entropy * mask).sum() / global_tokens
        return PolicyLossOutput(loss=loss, metrics={"rows": torch.tensor(float(rows.stop - rows.start))})

    return loss_fn


def test_log_probs_match_unpadded_reference():
    model, batch = make_model(), make_batch()
    out = TorchBackend(model).compute_log_probs(batch, with_entropy=True)
    for i in range(len(batch)):
        seq = torch.cat([batch.prompt_ids[i][batch.prompt_mask[i]], batch.response_ids[i][batch.response_mask[i]]])
        p, r = int(batch.prompt_mask[i].sum()), int(batch.response_mask[i].sum())
        with torch.no_grad():
            logits = model(seq[None]).double()[0]  # no padding at all, positions 0..len-1
        ref_all = torch.log_softmax(logits[p - 1 : p + r - 1], -1)
        ref = ref_all.gather(-1, seq[p:, None]).squeeze(-1)
        ref_entropy = torch.distributions.Categorical(logits=logits[p - 1 : p + r - 1]).entropy()
        torch.testing.assert_close(out.log_probs[i, :r].double(), ref, rtol=0, atol=1e-5)
        torch.testing.assert_close(out.entropy[i, :r].double(), ref_entropy, rtol=0, atol=1e-5)
        assert (out.log_probs[i, r:] == 0).all() and (out.entropy[i, r:] == 0).all()
    assert out.log_probs.dtype == torch.float32


def test_log_probs_are_stable_for_extreme_logits():
    class Loud(torch.nn.Module):  # logits of magnitude 1e4 in bfloat16: a naive softmax overflows
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(()))

        def forward(self, input_ids, attention_mask=None, position_ids=None):
            logits = torch.zeros(*input_ids.shape, 17)
            logits[..., 0] = 1e4
            logits[..., 1] = 1e4 - 2.0
            return (logits * self.w).to(torch.bfloat16)

    batch = make_batch(4)
    out = TorchBackend(Loud(), temperature=1.0).compute_log_probs(batch, with_entropy=True)
    assert torch.isfinite(out.log_probs).all() and torch.isfinite(out.entropy).all()
    expected_top = -math.log1p(math.exp(-2.0))
    is_zero = batch.response_ids == 0
    torch.testing.assert_close(out.log_probs[is_zero & batch.response_mask], torch.full(((is_zero & batch.response_mask).sum(),), expected_top))


def test_temperature_divides_logits():
    model, batch = make_model(), make_batch()
    hot = TorchBackend(model, temperature=2.0).compute_log_probs(batch).log_probs
    with torch.no_grad():
        logits = model(batch.input_ids, batch.attention_mask, batch.position_ids)
    p, t = batch.prompt_width, batch.response_ids.shape[1]
    ref = torch.log_softmax(logits[:, p - 1 : p + t - 1] / 2.0, -1).gather(-1, batch.response_ids[..., None]).squeeze(-1)
    torch.testing.assert_close(hot, ref * batch.response_mask)


def grads_after_step(micro_batch_size, clip_grad=None, batch=None):
    model, batch = make_model(), batch if batch is not None else make_batch()
    backend = TorchBackend(model, lr=0.0, clip_grad=clip_grad)
    adv = advantages_for(batch)
    metrics = backend.train_step(batch, weighted_loss(batch, adv, float(batch.response_mask.sum())), micro_batch_size=micro_batch_size)
    return {n: p.grad.clone() for n, p in model.named_parameters()}, metrics


def test_micro_batching_gives_the_full_batch_gradient():
    full, m_full = grads_after_step(None)
    micro, m_micro = grads_after_step(3)  # 8 rows -> 3 + 3 + 2
    for name in full:
        torch.testing.assert_close(micro[name], full[name], rtol=1e-5, atol=1e-7)
    assert m_micro["loss"] == pytest.approx(m_full["loss"], rel=1e-5)
    assert m_full["rows"] == 8.0 and m_micro["rows"] == 8.0  # metrics: summed over micro-batches (shares)
    assert m_micro["grad_norm"] == pytest.approx(m_full["grad_norm"], rel=1e-5)


def test_grad_clipping_reports_the_pre_clip_norm():
    raw, m_raw = grads_after_step(None, clip_grad=None)
    norm = torch.sqrt(sum((g.double() ** 2).sum() for g in raw.values())).item()
    assert m_raw["grad_norm"] == pytest.approx(norm, rel=1e-5)
    clip = norm / 4
    clipped, m_clip = grads_after_step(None, clip_grad=clip)
    assert m_clip["grad_norm"] == pytest.approx(norm, rel=1e-5)
    clipped_norm = torch.sqrt(sum((g.double() ** 2).sum() for g in clipped.values())).item()
    assert clipped_norm == pytest.approx(clip, rel=1e-4)
    for name in raw:  # same direction
        torch.testing.assert_close(clipped[name] * 4, raw[name], rtol=1e-4, atol=1e-7)


def test_non_finite_gradient_stops_with_a_clear_error():
    model, batch = make_model(), make_batch()
    backend = TorchBackend(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}

    def nan_loss(lp, rows):
        return PolicyLossOutput(loss=(lp.log_probs * float("nan")).sum())

    with pytest.raises(FloatingPointError, match="non-finite gradient norm.*step 1"):
        backend.train_step(batch, nan_loss)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_state_dict_round_trip_resumes_bit_identically():
    batch = make_batch()
    adv = advantages_for(batch)
    loss_fn = weighted_loss(batch, adv, float(batch.response_mask.sum()))

    a = TorchBackend(make_model(), lr=1e-2, weight_decay=0.1, betas=(0.8, 0.95))
    for _ in range(2):
        a.train_step(batch, loss_fn)
    saved = a.state_dict()
    for _ in range(3):
        a.train_step(batch, loss_fn)

    b = TorchBackend(make_model(seed=9), lr=1e-2, weight_decay=0.1, betas=(0.8, 0.95))
    b.load_state_dict(saved)
    assert b.step == 2
    for _ in range(3):
        b.train_step(batch, loss_fn)
    assert b.step == a.step == 5
    for (k, va), vb in zip(a.export_weights().items(), b.export_weights().values()):
        assert torch.equal(va, vb), k
    # the saved state is a snapshot: training afterwards did not change it
    c = TorchBackend(make_model(seed=9), lr=1e-2)
    c.load_state_dict(saved)
    assert not torch.equal(c.export_weights()["tok_emb.weight"], a.export_weights()["tok_emb.weight"])


def test_export_weights_are_copies_with_module_names():
    model = make_model()
    weights = TorchBackend(model).export_weights()
    assert list(weights) == list(model.state_dict())
    weights["tok_emb.weight"].zero_()
    assert model.tok_emb.weight.abs().sum() > 0


def test_load_state_dict_names_missing_keys():
    with pytest.raises(KeyError, match="optimizer"):
        TorchBackend(make_model()).load_state_dict({"model": {}, "step": 0})


# -- data parallelism over gloo ---------------------------------------------------------------------


def _dp_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        batch = make_batch(8)
        adv = advantages_for(batch)
        rows = slice(rank * 4, (rank + 1) * 4)
        shard = batch.select(rows)
        for reduction in ("sum", "mean"):
            if reduction == "sum":  # the contract: normalize by the global token count
                norm = float(batch.response_mask.sum())
            else:  # each rank's loss is a mean over its own shard; the ranks' gradients are averaged
                norm = float(shard.response_mask.sum())
            model = make_model()
            backend = TorchBackend(
                model, lr=0.0, clip_grad=None, process_group=dist.group.WORLD, dp_grad_reduction=reduction
            )
            metrics = backend.train_step(shard, weighted_loss(shard, adv[rows], norm), micro_batch_size=3)
            grads = {n: p.grad.clone() for n, p in model.named_parameters()}
            torch.save((grads, metrics["grad_norm"]), os.path.join(out_dir, f"{reduction}_{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(120)
def test_two_process_gloo_dp_equals_full_batch(tmp_path):
    ctx = mp.get_context("spawn")  # fork is unsafe once torch's thread pools exist
    port = _free_port()
    procs = [ctx.Process(target=_dp_worker, args=(r, 2, port, str(tmp_path))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=100)
        if p.exitcode is None:
            p.kill()
        assert p.exitcode == 0, f"DP worker exited with {p.exitcode}"
    results = {red: {r: torch.load(tmp_path / f"{red}_{r}.pt") for r in range(2)} for red in ("sum", "mean")}

    full, m_full = grads_after_step(None)  # one process, whole batch, global normalization
    for name in full:
        for rank in (0, 1):
            torch.testing.assert_close(results["sum"][rank][0][name], full[name], rtol=1e-5, atol=1e-7)
    assert results["sum"][0][1] == pytest.approx(m_full["grad_norm"], rel=1e-5)
    assert results["sum"][1][1] == results["sum"][0][1]

    # "mean": the average of the two shard-mean gradients, computed here independently
    batch, adv = make_batch(8), advantages_for(make_batch(8))
    expected = None
    for rank in (0, 1):
        rows = slice(rank * 4, (rank + 1) * 4)
        shard = batch.select(rows)
        model = make_model()
        TorchBackend(model, lr=0.0, clip_grad=None).train_step(shard, weighted_loss(shard, adv[rows], float(shard.response_mask.sum())))
        g = {n: p.grad.clone() / 2 for n, p in model.named_parameters()}
        expected = g if expected is None else {n: expected[n] + g[n] for n in g}
    for name in expected:
        torch.testing.assert_close(results["mean"][0][0][name], expected[name], rtol=1e-5, atol=1e-7)
