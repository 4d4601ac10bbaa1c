"""A packed row's attention in one variable-length call per layer (``relax.models.varlen_attention``).

The kernel itself (torch's flash-attention varlen) runs on CUDA only. Here it is replaced by a
reference with the same contract, in each of the three keyword sets torch's API has had, so that
what relax hands it (the layout, the sample bounds, causality, the scale, grouped-query heads) is
checked through a real transformers forward against the per-sample path; and the rules for when the
kernel is taken are checked on fake CUDA tensors.
"""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F

from relax.models import packing, varlen_attention
from relax.models.batch import TokenBatch

pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")

CALLS: list[dict] = []


def _attend(q, k, v, cu, max_len, *, causal, scale=None, gqa=False):
    """The kernel's contract: ``[T, H, D]`` tensors, samples at ``cu`` (int32), each attending to itself."""
    assert causal, "relax's packed attention is causal"
    assert q.is_contiguous() and k.is_contiguous() and v.is_contiguous()
    assert cu.dtype == torch.int32 and cu.device == q.device and int(cu[-1]) == q.shape[0]
    assert max_len == int(cu.diff().max())
    assert gqa or k.shape[1] == q.shape[1], "fewer key/value heads without enable_gqa"
    CALLS.append({"heads": (q.shape[1], k.shape[1]), "samples": len(cu) - 1, "scale": scale})
    parts = []
    for s, e in zip(cu[:-1].tolist(), cu[1:].tolist()):
        qi, ki, vi = (t[s:e].transpose(0, 1) for t in (q, k, v))
        parts.append(F.scaled_dot_product_attention(qi, ki, vi, is_causal=True, scale=scale,
                                                    enable_gqa=gqa).transpose(0, 1))
    return torch.cat(parts)


def varlen_torch_2_10(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None):
    return _attend(query, key, value, cu_seq_q, max_q, causal=is_causal)


def varlen_torch_2_11(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                      window_size=(-1, -1)):
    return _attend(query, key, value, cu_seq_q, max_q, causal=tuple(window_size) == (-1, 0), scale=scale)


def varlen_torch_2_12(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                      window_size=(-1, -1), enable_gqa=False, seqused_k=None, block_table=None, num_splits=None):
    return _attend(query, key, value, cu_seq_q, max_q, causal=tuple(window_size) == (-1, 0), scale=scale,
                   gqa=enable_gqa)


FLAVOURS = [varlen_torch_2_10, varlen_torch_2_11, varlen_torch_2_12]


BUDGET, VOCAB = 24, 17


def _qwen2():
    from transformers import Qwen2ForCausalLM

    from relax.models.hf.tiny_random import model_config

    torch.manual_seed(0)
    return Qwen2ForCausalLM(model_config("qwen2", VOCAB, hidden=64))  # 4 query heads, 2 key/value heads of 16


def _batch(n: int = 10) -> TokenBatch:
    """Left-padded prompts of 1..5 tokens, right-padded responses of 1..9: samples of 2..14 tokens."""
    g = torch.Generator().manual_seed(1)
    prompt_mask, response_mask = torch.zeros(n, 5, dtype=torch.bool), torch.zeros(n, 9, dtype=torch.bool)
    for i in range(n):
        prompt_mask[i, 5 - (1 + (i * 3) % 5):] = True
        response_mask[i, : 1 + (i * 7) % 9] = True
    return TokenBatch(prompt_ids=torch.randint(1, VOCAB, (n, 5), generator=g) * prompt_mask, prompt_mask=prompt_mask,
                      response_ids=torch.randint(1, VOCAB, (n, 9), generator=g) * response_mask,
                      response_mask=response_mask)


def _with_kernel(monkeypatch, fn):
    monkeypatch.setattr(varlen_attention, "_kernel", lambda: (fn, frozenset(inspect.signature(fn).parameters)))


@pytest.mark.parametrize("kernel", FLAVOURS, ids=lambda f: f.__name__)
def test_one_call_per_layer_gives_the_per_sample_log_probs(monkeypatch, kernel):
    from relax.backends.torch_backend import TorchBackend

    model, batch = _qwen2(), _batch()
    micro_batches = len(packing.plan_micro_batches(packing.sample_lengths(batch), BUDGET).groups)
    assert micro_batches > 1
    per_sample = TorchBackend(model, max_tokens_per_micro_batch=BUDGET).compute_log_probs(batch, with_entropy=True)
    _with_kernel(monkeypatch, kernel)
    monkeypatch.setattr(varlen_attention, "usable", lambda query, dropout, scaling: True)  # CPU, float32 here
    CALLS.clear()
    fused = TorchBackend(model, max_tokens_per_micro_batch=BUDGET).compute_log_probs(batch, with_entropy=True)
    layers = model.config.num_hidden_layers
    assert len(CALLS) == layers * micro_batches
    assert sum(c["samples"] for c in CALLS) == layers * len(batch)
    # Qwen2's 4 query heads over 2 key/value heads: repeated where the API cannot take them as they are
    assert {c["heads"] for c in CALLS} == ({(4, 2)} if kernel is varlen_torch_2_12 else {(4, 4)})
    if kernel is not varlen_torch_2_10:
        assert {c["scale"] for c in CALLS} == {16 ** -0.5}
    torch.testing.assert_close(fused.log_probs, per_sample.log_probs, rtol=0, atol=1e-6)
    torch.testing.assert_close(fused.entropy, per_sample.entropy, rtol=0, atol=1e-6)


def test_the_kernel_is_taken_on_cuda_in_half_precision_only(monkeypatch):
    from torch._subclasses.fake_tensor import FakeTensorMode

    _with_kernel(monkeypatch, varlen_torch_2_11)
    capable = {0: True}
    monkeypatch.setattr(varlen_attention, "_flash_capable", lambda index: capable[index])
    usable = varlen_attention.usable
    assert not usable(torch.zeros(1, 4, 8, 16, dtype=torch.bfloat16), 0.0, None)  # the CPU
    with FakeTensorMode():
        def query(dtype=torch.bfloat16, head_dim=16):
            return torch.empty(1, 4, 8, head_dim, dtype=dtype, device="cuda")

        assert usable(query(), 0.0, None) and usable(query(torch.float16), 0.0, 0.3)
        assert not usable(query(torch.float32), 0.0, None)  # flash attention: half precision
        torch.set_autocast_enabled("cuda", True)  # what torch.autocast("cuda", torch.bfloat16) sets on a GPU
        try:
            torch.set_autocast_dtype("cuda", torch.bfloat16)
            assert usable(query(torch.float32), 0.0, None)  # --bf16: float32 after the rotary embedding
            torch.set_autocast_dtype("cuda", torch.float32)
            assert not usable(query(torch.float32), 0.0, None)
        finally:
            torch.set_autocast_enabled("cuda", False)
            torch.set_autocast_dtype("cuda", torch.float16)
        assert not usable(query(), 0.1, None)  # no attention dropout in the kernel
        assert not usable(query(head_dim=12), 0.0, None) and not usable(query(head_dim=264), 0.0, None)
        capable[0] = False  # a GPU older than Ampere: no flash kernels
        assert not usable(query(), 0.0, None)
        capable[0] = True
        _with_kernel(monkeypatch, varlen_torch_2_10)  # no scale keyword: only the default scale
        assert usable(query(), 0.0, 16 ** -0.5) and not usable(query(), 0.0, 0.3)
        monkeypatch.setattr(varlen_attention, "_kernel", lambda: None)  # a torch without the API
        assert not usable(query(), 0.0, None)


def test_under_autocast_the_kernel_gets_the_autocast_dtype(monkeypatch):
    seen = []

    def kernel(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
               window_size=(-1, -1), enable_gqa=False):
        seen.append({query.dtype, key.dtype, value.dtype})
        return varlen_torch_2_12(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale=scale,
                                 window_size=window_size, enable_gqa=enable_gqa)

    _with_kernel(monkeypatch, kernel)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, heads, 7, 16, generator=g) for heads in (4, 2, 2))
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    plain = varlen_attention.causal_varlen_attention(q, k, v, cu, 4, None)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # --bf16's autocast, on this machine's device
        half = varlen_attention.causal_varlen_attention(q, k, v, cu, 4, None)
    assert seen == [{torch.float32}, {torch.bfloat16}] and half.dtype == torch.bfloat16
    torch.testing.assert_close(half.float(), plain, rtol=0, atol=3e-2)
