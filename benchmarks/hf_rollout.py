"""Rollout throughput of ``HFEngine`` against ``model.generate`` on the same model and batch.

    python benchmarks/hf_rollout.py                      # random Qwen3-style model built on the fly
    python benchmarks/hf_rollout.py --checkpoint DIR     # any local HF checkpoint (GPU if available)
    python benchmarks/hf_rollout.py --preset qwen2-0.5b --dtype bfloat16 --batch 64 --max-new-tokens 128
                                                         # a random Qwen2-0.5B-shaped model (on a GPU)
    python benchmarks/hf_rollout.py --smoke              # a tiny model, one repeat: for the test suite

Both sample at temperature 1 / top-p 1 from the same prompts and stop on EOS; throughput counts
generated (unmasked) tokens per second, best of ``--repeats`` interleaved runs. ``model.generate`` is
timed twice: plain (no scores) and with ``output_scores=True`` -- what it needs to return the
sampling log-probs that ``HFEngine`` always returns. The ratio ``HFEngine / generate`` is the number
to watch (target >= 1 on the CPU, >= 3 on a GPU, where the engine replays its decode step as a CUDA
graph). ``hf_engine`` is the engine as a run builds it on the device (``decoding`` names its path);
where that is not the dynamic cache, ``hf_engine_dynamic`` times the dynamic-cache path as well, and
``hf_engine_first_call_s`` is the first call's time (on CUDA it includes capturing the graph).

    python benchmarks/hf_rollout.py --train-steps 20     # + where a relax train step spends its time

runs ``relax train --hf-checkpoint`` (GDPO, a random byte-level Qwen3-style model, a two-component
toy reward) and prints the mean seconds per step of each role from its ``metrics.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from relax.rollout.base import SamplingParams
from relax.models.hf import load_hf_model, load_hf_tokenizer
from relax.rollout.hf import HFEngine
from relax.rollout.hf.engine import DECODINGS


def build_random_checkpoint(directory: Path, hidden: int, layers: int, vocab: int) -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "hf"))
    from tiny_checkpoints import build_tokenizer
    from transformers import AutoModelForCausalLM, Qwen3Config

    tok = build_tokenizer(directory)
    config = Qwen3Config(
        vocab_size=max(vocab, len(tok)),
        hidden_size=hidden,
        intermediate_size=3 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=max(hidden // 64, 2),
        num_key_value_heads=max(hidden // 128, 1),
        head_dim=64,
        max_position_embeddings=1024,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(str(directory))
    return directory


QWEN2_05B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, vocab_size=151936, max_position_embeddings=4096, tie_word_embeddings=True)


def build_qwen2_05b_checkpoint(directory: Path, device: str) -> Path:
    """A random model of Qwen2-0.5B's shape (494M parameters), initialised on ``device`` (seconds on a
    GPU, ~40 s on 16 CPU cores), with the tests' tiny word-level tokenizer."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "hf"))
    from tiny_checkpoints import build_tokenizer
    from transformers import AutoModelForCausalLM, Qwen2Config

    build_tokenizer(directory)
    config = Qwen2Config(**QWEN2_05B, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(str(directory))
    return directory


def time_engine(engine, prompts, params, seed) -> tuple[float, int]:
    gen = torch.Generator().manual_seed(seed)  # a CPU generator, as the rollout worker's
    _sync(engine.device)
    t0 = time.perf_counter()
    out = engine.generate(prompts, params, gen)
    _sync(engine.device)
    return time.perf_counter() - t0, int(out.batch.response_mask.sum())


def time_generate(model, tok, prompts, params, seed, *, with_scores: bool) -> tuple[float, int]:
    from relax.rollout.hf.engine import left_pad

    device = next(model.parameters()).device
    ids, mask = left_pad(prompts, tok.pad_id)
    ids, mask = ids.to(device), mask.to(device).long()
    torch.manual_seed(seed)
    _sync(device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=0,
            max_new_tokens=params.max_new_tokens,
            eos_token_id=list(tok.stop_ids),
            pad_token_id=tok.pad_id,
            output_scores=with_scores,
            return_dict_in_generate=with_scores,
        )
    _sync(device)
    elapsed = time.perf_counter() - t0
    seqs = out.sequences if with_scores else out
    new = seqs[:, ids.shape[1] :]
    # Real tokens: up to and including the first stop token of each row.
    is_stop = torch.isin(new, torch.tensor(tok.stop_ids, device=new.device))
    after_stop = (is_stop.long().cumsum(1) - is_stop.long()) > 0
    return elapsed, int((~after_stop).sum())


TOY_REWARD = """
def reward(prompt, completion, label, metadata):
    stopped = completion.endswith("<eos>") or completion.endswith("<|im_end|>")
    text = completion.removesuffix("<eos>").removesuffix("<|im_end|>")
    return {"digits": sum(c.isdigit() for c in text) / max(len(text), 1), "stops": float(stopped)}
"""


def train_role_times(steps: int, *, hidden: int, layers: int, max_new_tokens: int) -> dict:
    """Run ``relax train`` on a random HF model; mean seconds per step of each timed phase."""
    import os
    import subprocess

    from relax.models.hf.tiny_random import build_tiny_random_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        ckpt = build_tiny_random_checkpoint(tmp / "model", "qwen3", hidden=hidden, layers=layers)
        with (tmp / "prompts.jsonl").open("w") as f:
            for i in range(64):
                f.write(json.dumps({"question": f"What is {i} + {i + 3}?", "answer": str(2 * i + 3)}) + "\n")
        (tmp / "toy_reward.py").write_text(TOY_REWARD)
        env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        cmd = [
            "relax",
            "train",
            "--advantage-estimator",
            "gdpo",
            "--hf-checkpoint",
            str(ckpt),
            "--prompt-data",
            str(tmp / "prompts.jsonl"),
            "--input-key",
            "question",
            "--label-key",
            "answer",
            "--apply-chat-template",
            "--custom-rm-path",
            "toy_reward:reward",
            "--reward-keys",
            "digits",
            "stops",
            "--num-rollout",
            str(steps),
            "--rollout-batch-size",
            "8",
            "--n-samples-per-prompt",
            "4",
            "--global-batch-size",
            "32",
            "--rollout-max-response-len",
            str(max_new_tokens),
            "--lr",
            "1e-3",
            "--no-progress",
            "--output-dir",
            str(tmp / "out"),
        ]
        subprocess.run(cmd, cwd=tmp, env=env, check=True, capture_output=True, text=True)
        rows = [json.loads(line) for line in (tmp / "out" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "time/step_s" in r]  # training steps (not an evaluation-only step-0 row)
    rows = rows[1:] or rows  # the first step pays one-time costs (allocations, lazy imports)
    keys = sorted({k for r in rows for k in r if k.startswith("time/")})
    return {k: round(sum(r.get(k, 0.0) for r in rows) / len(rows), 4) for k in keys}


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--checkpoint", help="local HF checkpoint (default: a random Qwen3-style model)")
    parser.add_argument("--preset", choices=["qwen2-0.5b"],
                        help="a random checkpoint of this shape instead of --hidden/--layers/--vocab")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                        help="where the model runs (auto: cuda when available)")
    parser.add_argument("--decoding", choices=list(DECODINGS), default="auto",
                        help="the engine's decoding path (auto: CUDA graphs on CUDA, the dynamic cache on the CPU)")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument(
        "--train-steps", type=int, default=0, help="also time a relax train run of this many steps"
    )
    parser.add_argument("--smoke", action="store_true", help="a tiny model, one repeat: checks that it runs")
    args = parser.parse_args(argv)
    if args.smoke:
        args.hidden, args.layers, args.vocab, args.repeats = 64, 1, 512, 1
        args.batch, args.prompt_len, args.max_new_tokens = 2, 4, 4
    torch.set_num_threads(args.threads)
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device here")
    with tempfile.TemporaryDirectory() as tmp:
        if args.checkpoint:
            path = Path(args.checkpoint)
        elif args.preset == "qwen2-0.5b":
            path = build_qwen2_05b_checkpoint(Path(tmp), device)
        else:
            path = build_random_checkpoint(Path(tmp), args.hidden, args.layers, args.vocab)
        model = load_hf_model(path, dtype=args.dtype, device=device)
        tok = load_hf_tokenizer(path)
    engine = HFEngine(model, tok, device=device, decoding=args.decoding)  # auto: what a run gets here
    engines = {"hf_engine": engine}
    if engine.decoding != "dynamic cache":  # the path the engine had before, for comparison
        engines["hf_engine_dynamic"] = HFEngine(model, tok, device=device, decoding="dynamic")
    g = torch.Generator().manual_seed(0)
    vocab = min(model.config.vocab_size, tok.vocab_size)
    lengths = torch.randint(args.prompt_len // 2, args.prompt_len + 1, (args.batch,), generator=g)
    prompts = [
        [tok.bos_id or 1] + torch.randint(5, vocab, (int(n) - 1,), generator=g).tolist() for n in lengths
    ]
    params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=args.max_new_tokens)

    first_call_s = time_engine(engine, prompts, params, 0)[0]  # warm-up (allocator, kernels, graph capture)
    for other in list(engines.values())[1:]:
        time_engine(other, prompts, params, 0)
    time_generate(model, tok, prompts, params, 0, with_scores=False)
    best = {name: 0.0 for name in engines} | {"generate": 0.0, "generate_with_scores": 0.0}
    per_repeat: list[dict[str, float]] = []
    for r in range(args.repeats):  # interleaved, so machine load hits all alike
        per_repeat.append({})
        for name, fn in (
            *((name, lambda r=r, e=e: time_engine(e, prompts, params, r)) for name, e in engines.items()),
            ("generate", lambda r=r: time_generate(model, tok, prompts, params, r, with_scores=False)),
            (
                "generate_with_scores",
                lambda r=r: time_generate(model, tok, prompts, params, r, with_scores=True),
            ),
        ):
            seconds, tokens = fn()
            best[name] = max(best[name], tokens / seconds)
            per_repeat[-1][name] = tokens / seconds
    result = {
        "device": device,
        "model": str(args.checkpoint or (f"random {args.preset}" if args.preset
                                         else f"random qwen3 h{args.hidden} L{args.layers} V{args.vocab}")),
        "dtype": args.dtype,
        "params": sum(p.numel() for p in model.parameters()),
        "batch": args.batch,
        "max_new_tokens": args.max_new_tokens,
        "decoding": engine.decoding,
        "hf_engine_first_call_s": round(first_call_s, 3),
        "tokens_per_s": {k: round(v, 1) for k, v in best.items()},
        "ratio_vs_generate": round(best["hf_engine"] / best["generate"], 3),
        "ratio_vs_generate_with_scores": round(best["hf_engine"] / best["generate_with_scores"], 3),
        **({"ratio_vs_dynamic": round(best["hf_engine"] / best["hf_engine_dynamic"], 3)}
           if "hf_engine_dynamic" in best else {}),
        # Median over repeats of the ratio within one repeat: robust to load that drifts between repeats.
        "paired_ratio_median_vs_generate": round(
            statistics.median(x["hf_engine"] / x["generate"] for x in per_repeat), 3
        ),
        "paired_ratio_median_vs_generate_with_scores": round(
            statistics.median(x["hf_engine"] / x["generate_with_scores"] for x in per_repeat), 3
        ),
    }
    if args.train_steps:
        result["train_step_seconds_by_role"] = train_role_times(
            args.train_steps, hidden=args.hidden, layers=args.layers, max_new_tokens=args.max_new_tokens
        )
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
