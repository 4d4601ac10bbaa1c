"""The truncation replay and the off-policy numerics on a CUDA device: the same kept sets (ties
included: the stable sort) and values as on the CPU, tensors made on the device of the data, finite
gradients through the padded and packed passes."""

from __future__ import annotations

import pytest
import torch

from relax.algorithms import numerics
from relax.models.batch import TokenBatch, response_log_probs
from relax.models.packed_forward import packed_log_probs
from relax.models.sampled_distribution import Truncation, dropped_tokens, sampled_log_softmax
from relax.models.tiny.model import TinyCausalLM, TinyLMConfig

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CUDA = torch.device("cuda")


def test_ties_break_in_token_order_on_the_device():
    # 0.2, then 5000 tokens of 0.00016: top-p 0.50008 keeps the tied tokens of rank r <= 1875
    probs = torch.tensor([[0.2] + [0.8 / 5000] * 5000], dtype=torch.float64)
    scores = torch.log(probs).float().to(CUDA)
    kept = (~dropped_tokens(scores, Truncation(top_p=0.50008)))[0].nonzero().flatten().tolist()
    assert kept == list(range(1877))


@pytest.mark.parametrize("rule", [Truncation(top_p=0.7), Truncation(top_k=3), Truncation(min_p=0.2),
                                  Truncation(top_p=0.8, top_k=4, min_p=0.05)])
def test_kept_sets_and_log_probs_equal_the_cpus(rule):
    g = torch.Generator().manual_seed(11)
    scores = torch.randn(256, 1000, generator=g) * 2
    scores[:32, 5] = scores[:32, 2]
    tokens = torch.randint(0, 1000, (256,), generator=g)
    on_device = dropped_tokens(scores.to(CUDA), rule, tokens.to(CUDA))
    assert on_device.device.type == "cuda"
    assert torch.equal(on_device.cpu(), dropped_tokens(scores, rule, tokens))
    a = sampled_log_softmax(scores, rule, tokens).gather(1, tokens[:, None])
    b = sampled_log_softmax(scores.to(CUDA), rule, tokens.to(CUDA)).gather(1, tokens.to(CUDA)[:, None]).cpu()
    assert float((a - b).abs().max()) < 1e-5


def test_padded_and_packed_passes_on_the_device():
    torch.manual_seed(0)
    model = TinyCausalLM(TinyLMConfig()).to(CUDA)
    g = torch.Generator().manual_seed(2)
    n, p, t = 6, 5, 7
    prompt_mask = torch.arange(p)[None] >= (p - torch.randint(1, p + 1, (n,), generator=g))[:, None]
    response_mask = torch.arange(t)[None] < torch.randint(1, t + 1, (n,), generator=g)[:, None]
    batch = TokenBatch(prompt_ids=torch.randint(3, 17, (n, p), generator=g).masked_fill(~prompt_mask, 0),
                       prompt_mask=prompt_mask, response_mask=response_mask,
                       response_ids=torch.randint(3, 17, (n, t), generator=g).masked_fill(~response_mask, 0)).to(CUDA)
    rule = Truncation(top_p=0.7, top_k=8)
    logits = model(batch.input_ids, batch.attention_mask, batch.position_ids)
    padded = response_log_probs(logits, batch, with_entropy=True, temperature=0.8, truncation=rule)
    assert padded.log_probs.device.type == "cuda" and torch.isfinite(padded.entropy).all()
    (padded.log_probs.sum() + padded.entropy.sum()).backward()
    assert all(torch.isfinite(q.grad).all() for q in model.parameters() if q.grad is not None)
    packed = packed_log_probs(model, batch, torch.arange(n, device=CUDA), with_entropy=True, temperature=0.8,
                              truncation=rule)
    assert float((packed.log_probs - padded.log_probs.detach()).abs().max()) < 1e-4
    full = response_log_probs(logits.detach(), batch, with_entropy=False, temperature=0.8)
    assert float((padded.log_probs.detach() - full.log_probs).abs().max()) > 1e-2  # the truncation acted


def test_off_policy_numerics_on_the_device():
    g = torch.Generator().manual_seed(4)
    proximal = -torch.rand(4, 9, generator=g)
    behaviour = proximal - 0.05 * torch.randn(4, 9, generator=g)
    mask = torch.arange(9)[None] < torch.tensor([9, 5, 3, 1])[:, None]
    for mode in ("tis", "seq_tis", "seq_geo_tis", "seq_mask_tis"):
        weight, _ = numerics.behaviour_weights(proximal.to(CUDA), behaviour.to(CUDA), mode, 1.05, mask=mask.to(CUDA))
        assert weight.device.type == "cuda"
        units = numerics.unit_log_weights(proximal.to(CUDA), behaviour.to(CUDA), mask.to(CUDA), mode)
        on_device = numerics.weight_statistics(units, mode, 1.05)
        on_cpu = numerics.weight_statistics(numerics.unit_log_weights(proximal, behaviour, mask, mode), mode, 1.05)
        assert on_device == {k: pytest.approx(v, rel=1e-9) for k, v in on_cpu.items()}
    kl = numerics.kl_estimate(proximal.to(CUDA), behaviour.to(CUDA), "abs")
    assert kl.device.type == "cuda" and torch.allclose(kl.cpu(), (proximal - behaviour).abs())
