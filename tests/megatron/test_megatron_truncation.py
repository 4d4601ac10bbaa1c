"""Megatron scores the truncated sampling distribution like the torch path: vocabulary-parallel logits
(TP=2) with the kept set replayed (``relax.backends.megatron.logprobs.vocab_parallel_truncate``) give
the log-probs and entropy of ``relax.models.batch.response_log_probs`` on the plain-torch model."""

from __future__ import annotations

import importlib.util

import pytest
import torch

pytestmark = [
    pytest.mark.megatron,
    pytest.mark.skipif(importlib.util.find_spec("megatron.core") is None, reason="megatron-core is not installed"),
]

from megatron_harness import run_distributed  # noqa: E402
import megatron_workers as W  # noqa: E402

from relax.models.batch import response_log_probs  # noqa: E402
from relax.models.sampled_distribution import Truncation  # noqa: E402
from relax.models.tiny.model import TinyCausalLM  # noqa: E402

TRUNCATION = Truncation(top_p=0.8, top_k=9, min_p=0.02)
TEMPERATURE = 0.7


def truncated_log_probs(rank: int, world: int) -> dict:
    backend = W._megatron(tensor_model_parallel_size=world, temperature=TEMPERATURE, truncation=TRUNCATION)
    out = backend.compute_log_probs(W.make_batch(), with_entropy=True)
    return {"log_probs": out.log_probs, "entropy": out.entropy}


@pytest.mark.timeout(300)
def test_tp2_replays_the_kept_set_like_the_torch_path():
    batch = W.make_batch()
    model = TinyCausalLM(W.CFG)
    model.load_state_dict(W.initial_weights())
    with torch.no_grad():
        logits = model(batch.input_ids, batch.attention_mask, batch.position_ids)
    want = response_log_probs(logits, batch, with_entropy=True, temperature=TEMPERATURE, truncation=TRUNCATION)
    full = response_log_probs(logits, batch, with_entropy=False, temperature=TEMPERATURE)
    assert float((want.log_probs - full.log_probs).abs().max()) > 0.05  # the truncation matters here
    for rank in run_distributed(truncated_log_probs, 2):
        assert float((rank["log_probs"] - want.log_probs).abs().max()) < 2e-5
        assert float((rank["entropy"] - want.entropy).abs().max()) < 2e-5
