"""The transformers engine's static-cache decoding (the path that CUDA graphs replay on a GPU) against
its dynamic-cache decoding (the CPU default): the same tokens and the same log-probs for the same
seed. On the CPU everything but the graph capture runs; the capture itself is checked where CUDA is."""

import pytest
import torch

from relax.models.hf import HFTokenizer, load_hf_model, load_hf_tokenizer
from relax.rollout.base import SamplingParams
from relax.rollout.hf import HFEngine
from relax.rollout.hf import engine as engine_module
from relax.rollout.hf.decoding import GraphCaptureError, StaticDecoding

PROMPTS = ["what is 3 + 4 ?", "hello", "add the numbers 1 and 2 please", "yes", "the sum of 5 and 6"]
SETTINGS = [
    SamplingParams(temperature=0.0, max_new_tokens=12),
    SamplingParams(temperature=1.0, max_new_tokens=12),
    SamplingParams(temperature=1.3, top_p=0.8, max_new_tokens=70),  # past one 64-slot length bucket
]


def engines(path, *, device="cpu", attn_implementation="sdpa", dtype=torch.float32):
    """A dynamic-cache and a static-cache engine over one model; some word ids also stop a row, so
    rows end at different steps."""
    tok = load_hf_tokenizer(path)
    tok = HFTokenizer(tok.hf, extra_stop_ids=range(3, tok.vocab_size, 9))
    model = load_hf_model(path, device=device, attn_implementation=attn_implementation, dtype=dtype)
    static = "cuda-graphs" if torch.device(device).type == "cuda" else "static"
    return HFEngine(model, tok, decoding="dynamic"), HFEngine(model, tok, decoding=static)


def assert_same_generation(a, b, atol):
    assert torch.equal(a.batch.response_ids, b.batch.response_ids)
    assert torch.equal(a.batch.response_mask, b.batch.response_mask)
    # float rounding only: the static cache's attention also sums over masked (zero-weight) slots
    torch.testing.assert_close(a.log_probs, b.log_probs, atol=atol, rtol=0)


def test_static_cache_gives_the_dynamic_cache_tokens_and_log_probs(checkpoints, family):
    dynamic, static = engines(checkpoints[family])
    assert static.decoding == "static cache" and dynamic.decoding == "dynamic cache"
    prompts = [static.tokenizer.encode(p) for p in PROMPTS] * 3  # 15 rows: a batch bucket of 16
    for params in SETTINGS:
        a = dynamic.generate(prompts, params, torch.Generator().manual_seed(5))
        b = static.generate(prompts, params, torch.Generator().manual_seed(5))
        lengths = a.batch.response_mask.sum(1)
        assert lengths.min() < lengths.max()  # rows stopped at different steps
        assert_same_generation(a, b, atol=2e-5)
        assert (b.log_probs[b.batch.response_mask] < 0).all() or params.temperature == 0
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    assert ALL_ATTENTION_FUNCTIONS["sdpa"] is sdpa_attention_forward  # the decode step's override is undone


def test_static_cache_with_eager_attention(checkpoints):
    """Eager attention takes an additive float mask instead of SDPA's booleans."""
    dynamic, static = engines(checkpoints["qwen2"], attn_implementation="eager")
    prompts = [static.tokenizer.encode(p) for p in PROMPTS]
    a = dynamic.generate(prompts, SETTINGS[1], torch.Generator().manual_seed(1))
    b = static.generate(prompts, SETTINGS[1], torch.Generator().manual_seed(1))
    assert_same_generation(a, b, atol=2e-5)


def test_one_engine_serves_several_shapes_and_keeps_few_buckets(checkpoints):
    dynamic, static = engines(checkpoints["llama"])
    tok = static.tokenizer
    calls = [(PROMPTS * 2, 8), (PROMPTS[:2], 8), (PROMPTS * 4, 3), (PROMPTS[1:3] * 9, 100), (PROMPTS * 2, 8)]
    for i, (texts, new_tokens) in enumerate(calls):  # batch and width change from call to call
        prompts = [tok.encode(t) for t in texts]
        params = SamplingParams(max_new_tokens=new_tokens)
        a = dynamic.generate(prompts, params, torch.Generator().manual_seed(i))
        b = static.generate(prompts, params, torch.Generator().manual_seed(i))
        assert_same_generation(a, b, atol=2e-5)
    buckets = static._decoding._buckets
    assert len(buckets) == 4  # five calls, four shapes (the last reuses the first's), at most MAX_BUCKETS
    assert all(batch % 8 == 0 and length % 64 == 0 for batch, length in buckets)


def test_static_cache_after_new_weights(checkpoints):
    dynamic, static = engines(checkpoints["qwen3"])
    prompts = [static.tokenizer.encode(p) for p in PROMPTS]
    static.generate(prompts, SETTINGS[1], torch.Generator().manual_seed(0))  # a bucket exists
    weights = {k: v * 1.1 for k, v in static.model.state_dict().items()}
    static.load_weights(weights)  # the model is shared: the dynamic engine sees them too
    a = dynamic.generate(prompts, SETTINGS[1], torch.Generator().manual_seed(2))
    b = static.generate(prompts, SETTINGS[1], torch.Generator().manual_seed(2))
    assert_same_generation(a, b, atol=2e-5)


def test_a_failed_capture_falls_back_to_the_dynamic_cache_and_says_so(checkpoints, monkeypatch):
    dynamic, static = engines(checkpoints["qwen2"])
    static._decoding.cuda_graphs = True  # as on CUDA; the capture is made to fail

    def fail(self, bucket):
        raise GraphCaptureError("RuntimeError: operation not permitted when stream is capturing")

    monkeypatch.setattr(StaticDecoding, "_capture", fail)
    monkeypatch.setattr(engine_module, "_said", set())
    prompts = [static.tokenizer.encode(p) for p in PROMPTS]
    with pytest.warns(RuntimeWarning, match="could not capture its decode step as a CUDA graph"):
        b = static.generate(prompts, SETTINGS[1], torch.Generator().manual_seed(4))
    assert static.decoding == "dynamic cache"
    a = dynamic.generate(prompts, SETTINGS[1], torch.Generator().manual_seed(4))
    assert torch.equal(a.batch.response_ids, b.batch.response_ids) and torch.equal(a.log_probs, b.log_probs)


def test_cuda_graphs_without_cuda_fall_back_once(checkpoints, monkeypatch):
    monkeypatch.setattr(engine_module, "_said", set())
    tok = load_hf_tokenizer(checkpoints["qwen2"])
    model = load_hf_model(checkpoints["qwen2"])
    with pytest.warns(RuntimeWarning, match="CUDA graphs need a CUDA device"):
        engine = HFEngine(model, tok, decoding="cuda-graphs")
    assert engine.decoding == "dynamic cache"
    assert HFEngine(model, tok).decoding == "dynamic cache"  # the CPU default
    with pytest.raises(ValueError, match="decoding must be one of"):
        HFEngine(model, tok, decoding="compiled")


def teacher_forced_distance(model, gen) -> float:
    """Mean |engine log-prob - log_softmax of one plain forward over the whole sequences| (T = 1)."""
    b = gen.batch.to(model.device) if hasattr(gen.batch, "to") else gen.batch
    ids, mask = b.input_ids.to(model.device), b.attention_mask.to(model.device)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask.long(), position_ids=b.position_ids.to(model.device)).logits
    lp = torch.log_softmax(logits[:, b.prompt_width - 1 : -1].float(), -1)
    chosen = lp.gather(-1, b.response_ids.to(model.device)[..., None])[..., 0].cpu()
    m = b.response_mask.cpu()
    return float((chosen[m] - gen.log_probs[m]).abs().mean())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_cuda_graph_decoding_gives_the_dynamic_cache_tokens_and_log_probs(checkpoints, family):
    dynamic, graphs = engines(checkpoints[family], device="cuda")
    assert graphs.decoding == "static cache + CUDA graphs" and graphs.device.type == "cuda"
    prompts = [graphs.tokenizer.encode(p) for p in PROMPTS] * 3
    for params in SETTINGS:
        a = dynamic.generate(prompts, params, torch.Generator().manual_seed(5))
        b = graphs.generate(prompts, params, torch.Generator().manual_seed(5))
        assert b.log_probs.device.type == "cpu" and b.batch.response_ids.device.type == "cpu"
        assert_same_generation(a, b, atol=1e-4)
    assert any(bucket.graph is not None for bucket in graphs._decoding._buckets.values())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_cuda_graph_decoding_in_bfloat16(checkpoints):
    """bf16 rounds differently with the cache's length, so sampled rows may part ways: each engine's
    log-probs are checked against a plain forward of its own samples, the graphs' no further off."""
    dynamic, graphs = engines(checkpoints["qwen2"], device="cuda", dtype=torch.bfloat16)
    prompts = [graphs.tokenizer.encode(p) for p in PROMPTS] * 3
    a = dynamic.generate(prompts, SETTINGS[1], torch.Generator().manual_seed(5))
    b = graphs.generate(prompts, SETTINGS[1], torch.Generator().manual_seed(5))
    off_dynamic, off_graphs = teacher_forced_distance(dynamic.model, a), teacher_forced_distance(graphs.model, b)
    assert off_graphs <= 2 * off_dynamic + 1e-2, (off_graphs, off_dynamic)
