"""Rollout throughput of relax's transformers engine (``HFEngine``) against the vLLM engine, in one run.

    python benchmarks/rollout_engines.py --json        # needs the vllm extra (pip install -e '.[vllm]')
    python benchmarks/rollout_engines.py --smoke       # a tiny model, one repeat: for the test suite

Both engines load the same random ~20M-parameter Qwen2-shaped checkpoint (hidden 512, 4 layers,
vocabulary 8192; built here with ``save_pretrained``, nothing downloaded), in float32, and sample
the same prompts (64 prompts of 16 random tokens, 32 new tokens each, temperature 1, top-p 1,
behaviour log-probs on) through the same ``GenerationEngine.generate`` call relax's rollout
workers make. No stop token is set, so both generate exactly 64 x 32 tokens and the work is equal.
Throughput is generated tokens per second, best of ``--repeats`` interleaved runs after one
warm-up call each; both run with the same number of torch threads. The last line is JSON with
``hf_tokens_per_s``, ``vllm_tokens_per_s`` and their ratio (target: vLLM >= 1.3x on a 2-core CPU).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch


class TokenIdsTokenizer:
    """Prompts are token ids already; no stop token (every row runs to the length limit)."""

    pad_id = 0
    eos_id = -1
    stop_ids: tuple[int, ...] = ()

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def decode(self, ids: list[int]) -> str:
        return " ".join(map(str, ids))


def build_checkpoint(directory: Path, *, hidden: int, layers: int, vocab: int) -> Path:
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=int(2.75 * hidden), num_hidden_layers=layers,
        num_attention_heads=hidden // 64, num_key_value_heads=max(hidden // 256, 1), max_position_embeddings=512,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0, rope_theta=10000.0,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(str(directory))
    return directory


def measure(engine, prompts, params, repeats: int, seed: int) -> list[float]:
    rates = []
    for r in range(repeats):
        t0 = time.perf_counter()
        gen = engine.generate(prompts, params, generator=torch.Generator().manual_seed(seed + r))
        elapsed = time.perf_counter() - t0
        rates.append(int(gen.batch.response_mask.sum()) / elapsed)
    return rates


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    parser.add_argument("--json", action="store_true", help="print the result as JSON on the last line")
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="a tiny model, one repeat: checks that it runs")
    args = parser.parse_args(argv)
    if args.smoke:
        args.hidden, args.layers, args.vocab, args.repeats = 64, 1, 512, 1
        args.prompts, args.prompt_len, args.new_tokens = 4, 4, 4

    from relax.rollout.vllm.environment import prepare_process

    prepare_process()  # before transformers: the in-process engine settings
    from relax.models.hf.loading import load_hf_model
    from relax.rollout.base import SamplingParams
    from relax.rollout.hf.engine import HFEngine
    from relax.rollout.vllm.engine import VLLMEngine
    from relax.rollout.vllm.factory import build_llm

    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, args.vocab, (args.prompts, args.prompt_len), generator=g).tolist()
    params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=args.new_tokens)
    with tempfile.TemporaryDirectory() as tmp:
        path = build_checkpoint(Path(tmp) / "qwen2-20m", hidden=args.hidden, layers=args.layers, vocab=args.vocab)
        model = load_hf_model(path)
        parameters = sum(p.numel() for p in model.parameters())
        hf = HFEngine(model, TokenIdsTokenizer())
        t0 = time.perf_counter()
        vllm = VLLMEngine(build_llm(str(path), seed=0, max_model_len=args.prompt_len + args.new_tokens + 8),
                          TokenIdsTokenizer())
        start_s = time.perf_counter() - t0
        torch.set_num_threads(args.threads)
        for engine in (hf, vllm):  # warm-up
            engine.generate(prompts[:4], params, generator=torch.Generator().manual_seed(99))
        hf_rates, vllm_rates = [], []
        for r in range(args.repeats):  # interleaved: both see the same machine load
            hf_rates += measure(hf, prompts, params, 1, seed=r)
            vllm_rates += measure(vllm, prompts, params, 1, seed=r)
    result = {
        "parameters": parameters,
        "prompts": args.prompts,
        "new_tokens": args.new_tokens,
        "threads": torch.get_num_threads(),
        "hf_tokens_per_s": round(max(hf_rates), 1),
        "vllm_tokens_per_s": round(max(vllm_rates), 1),
        "vllm_over_hf": round(max(vllm_rates) / max(hf_rates), 3),
        "vllm_start_s": round(start_s, 1),
    }
    if not args.json:
        print(f"transformers engine {result['hf_tokens_per_s']} tok/s, vLLM {result['vllm_tokens_per_s']} tok/s "
              f"({result['vllm_over_hf']}x), {parameters / 1e6:.1f}M parameters")
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
