"""TorchBackend sums the loss metrics over micro-batches (they are shares, like the loss), so the
metrics of a micro-batched step equal those of the same step in one micro-batch."""

from __future__ import annotations

import pytest
import torch

from relax.algorithms import PolicyLossInputs, get_algorithm
from relax.models.batch import TokenBatch
from relax.backends.torch_backend import TorchBackend
from relax.models.tiny.model import TinyCausalLM, TinyLMConfig


def _model() -> TinyCausalLM:
    torch.manual_seed(0)
    model = TinyCausalLM(TinyLMConfig())
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return model


def _batch(n: int = 8) -> TokenBatch:
    """Prompts of 2..5 tokens (left-padded), responses of 1..6 tokens (right-padded)."""
    g = torch.Generator().manual_seed(1)
    pw, rw = 5, 6
    prompt_ids = torch.zeros(n, pw, dtype=torch.long)
    prompt_mask = torch.zeros(n, pw, dtype=torch.bool)
    response_ids = torch.zeros(n, rw, dtype=torch.long)
    response_mask = torch.zeros(n, rw, dtype=torch.bool)
    for i in range(n):
        lp, lr = 2 + i % 4, 1 + (i * 5) % rw
        prompt_ids[i, pw - lp:] = torch.randint(1, 17, (lp,), generator=g)
        prompt_mask[i, pw - lp:] = True
        response_ids[i, :lr] = torch.randint(1, 17, (lr,), generator=g)
        response_mask[i, :lr] = True
    return TokenBatch(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids,
                      response_mask=response_mask)


def _step_metrics(name: str, micro_batch_size: int | None) -> dict[str, float]:
    """One GRPO-family step with global token/sequence normalization, as the actor runs it."""
    batch = _batch()
    config = {"eps_clip_c": 1.5} if name != "cispo" else {}
    if name == "m2po":
        config["m2po_kl2_budget"] = 10.0  # inactive trust region: the clip range is the same per micro-batch
    cls = get_algorithm(name)
    algorithm = cls(cls.Config(entropy_coef=0.01, **config))
    backend = TorchBackend(_model(), lr=0.0)
    old = backend.compute_log_probs(batch).log_probs
    g = torch.Generator().manual_seed(2)
    # Old log-probs shifted by up to +-0.6: the ratio leaves the clip band on some tokens.
    old = (old - (torch.rand(old.shape, generator=g) - 0.5) * 1.2) * batch.response_mask
    advantages = torch.randn(old.shape, generator=g) * batch.response_mask
    tokens, sequences = float(batch.response_mask.sum()), float(len(batch))

    def loss_fn(lp, rows):
        return algorithm.policy_loss(PolicyLossInputs(
            log_probs=lp.log_probs, old_log_probs=old[rows], advantages=advantages[rows],
            response_mask=batch.response_mask[rows], entropy=lp.entropy,
            global_num_tokens=tokens, global_num_sequences=sequences,
        ))

    return backend.train_step(batch, loss_fn, micro_batch_size=micro_batch_size)


@pytest.mark.parametrize("name", ["grpo", "cispo", "m2po"])
def test_micro_batched_step_reports_the_one_micro_batch_metrics(name):
    whole = _step_metrics(name, None)
    micro = _step_metrics(name, 3)  # 8 rows -> 3 + 3 + 2
    for key in ("loss", "pg_loss", "pg_clipfrac", "ppo_kl", "entropy"):
        assert key in whole, key
    if name != "m2po":  # (M2PO's trust region is off here: nothing is clipped)
        assert 0.0 < whole["pg_clipfrac"] < 1.0  # the clip acts on some tokens, not all
    assert whole.keys() == micro.keys()
    for key, value in whole.items():
        if key in ("m2_before", "m2_after"):
            continue  # per-micro-batch statistics: their token-weighted mean (tests/algorithms)
        assert micro[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    if name == "m2po":
        assert micro["eps_low"] == pytest.approx(1.0, rel=1e-6)  # averaged shares would read 1/3
