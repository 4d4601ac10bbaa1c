"""The vLLM engine on a GPU: rollout tokens/s of both engines and ``relax train`` steps, in a few minutes.

Prepared for the first GPU machine (not run yet: none has been lent); ``benchmarks/gpu_vllm.sh``
installs the CUDA build of vLLM and calls this. Nothing is downloaded: the checkpoint is a random
Qwen2-0.5B-shaped model (hidden 896, 24 layers, 14 heads / 2 KV heads, MLP 4864, vocabulary 151936,
tied embeddings; ~494M parameters) written here with ``save_pretrained``.

1. Rollout: 128 prompts of 64 random tokens, 128 new tokens each, temperature 1, both engines in
   bfloat16 and in float32 on one GPU, best of 2 after a warm-up (``benchmarks/rollout_engines.py``'s
   measurement, the same ``GenerationEngine.generate`` call the rollout workers make).
2. Training: ``relax train --bf16`` (GDPO, a two-component toy reward, 3 steps) with
   ``--rollout-engine hf`` and then ``vllm``: the mean ``time/step_s`` of steps 2-3 and the largest
   ``rollout/logprob_abs_diff`` (bfloat16 training against a float32 engine: expect ~1e-2).

The last line is JSON with every number; paste them into docs/en/rollout-engines.md (and zh).
``--smoke`` runs step 1 on a tiny model in float32 on whatever device there is (the test suite's check
that the script works; it needs the vllm extra).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "hf"))

QWEN2_05B = {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
                 "intermediate_size": 4864, "vocab_size": 151936, "tie_word_embeddings": True}
SMOKE = {"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 1, "num_key_value_heads": 1,
             "intermediate_size": 128, "vocab_size": 512, "tie_word_embeddings": True}


def build_checkpoint(directory: Path, **shape) -> Path:
    """A random Qwen2 of ``shape`` plus the tests' word-level tokenizer (for ``relax train``)."""
    from tiny_checkpoints import build_tokenizer
    from transformers import AutoModelForCausalLM, Qwen2Config

    build_tokenizer(directory)
    config = Qwen2Config(**shape, max_position_embeddings=4096, rope_theta=1000000.0, rms_norm_eps=1e-6,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.bfloat16)
    model.save_pretrained(str(directory))
    return directory


def rollout(path: Path, dtype: str, vocab: int, device: str, args) -> dict:
    from rollout_engines import TokenIdsTokenizer, measure

    from relax.models.hf.loading import load_hf_model
    from relax.rollout.base import SamplingParams
    from relax.rollout.hf.engine import HFEngine
    from relax.rollout.vllm.engine import VLLMEngine
    from relax.rollout.vllm.factory import build_llm

    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, vocab, (args.prompts, args.prompt_len), generator=g).tolist()
    params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=args.new_tokens)
    hf = HFEngine(load_hf_model(path, dtype=dtype, device=device), TokenIdsTokenizer())
    hf.generate(prompts[:4], params, generator=torch.Generator().manual_seed(9))
    hf_rate = max(measure(hf, prompts, params, 2, seed=0))
    del hf
    if device == "cuda":
        torch.cuda.empty_cache()
    llm = build_llm(str(path), seed=0, dtype=dtype, max_model_len=args.prompt_len + args.new_tokens + 8,
                    gpu_memory_utilization=0.6)
    vllm = VLLMEngine(llm, TokenIdsTokenizer())
    vllm.generate(prompts[:4], params, generator=torch.Generator().manual_seed(9))
    vllm_rate = max(measure(vllm, prompts, params, 2, seed=0))
    del vllm, llm
    if device == "cuda":
        torch.cuda.empty_cache()
    return {f"{dtype}_hf_tokens_per_s": round(hf_rate, 1), f"{dtype}_vllm_tokens_per_s": round(vllm_rate, 1),
            f"{dtype}_vllm_over_hf": round(vllm_rate / hf_rate, 2)}


def train(path: Path, engine: str, workdir: Path) -> dict:
    data = workdir / "prompts.jsonl"
    data.write_text("".join(json.dumps({"q": f"what is {i} + {i} ?", "a": 2 * i}) + "\n" for i in range(64)))
    shutil.copy(HERE.parent / "tests" / "hf" / "toy_reward.py", workdir / "toy_reward.py")
    out = workdir / f"run-{engine}"
    cmd = ["relax", "train", "--advantage-estimator", "gdpo", "--hf-checkpoint", str(path), "--bf16",
           "--rollout-engine", engine, "--prompt-data", str(data), "--input-key", "q", "--label-key", "a",
           "--custom-rm-path", "toy_reward:reward", "--reward-keys", "digits", "stops", "--num-rollout", "3",
           "--rollout-batch-size", "16", "--n-samples-per-prompt", "8", "--rollout-max-response-len", "128",
           "--num-steps-per-rollout", "1", "--lr", "1e-6", "--no-progress", "--output-dir", str(out)]
    env = {**os.environ, "PYTHONPATH": str(workdir)}
    subprocess.run(cmd, cwd=workdir, env=env, check=True)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "time/step_s" in r]
    result = {f"train_{engine}_step_s": round(sum(r["time/step_s"] for r in rows[1:]) / max(len(rows) - 1, 1), 2)}
    if engine == "vllm":
        result["train_vllm_max_logprob_abs_diff"] = max(r["rollout/logprob_abs_diff"] for r in rows)
    return result


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    parser.add_argument("--prompts", type=int, default=128)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--skip-train", action="store_true", help="only the rollout measurement")
    parser.add_argument("--smoke", action="store_true", help="a tiny model, float32, no training: checks it runs")
    args = parser.parse_args(argv)
    shape, dtypes = QWEN2_05B, ("bfloat16", "float32")
    if args.smoke:
        shape, dtypes, args.skip_train = SMOKE, ("float32",), True
        args.prompts, args.prompt_len, args.new_tokens = 4, 4, 4
    elif not torch.cuda.is_available():
        raise SystemExit("benchmarks/gpu_vllm.py needs a CUDA GPU (on CPU: benchmarks/rollout_engines.py)")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    from safetensors.torch import load_file

    from relax.rollout.vllm.environment import prepare_process

    prepare_process()
    result = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu"}
    with tempfile.TemporaryDirectory() as tmp:
        path = build_checkpoint(Path(tmp) / "qwen2-random", **shape)
        result["parameters"] = sum(t.numel() for f in path.glob("*.safetensors") for t in load_file(str(f)).values())
        for dtype in dtypes:
            result.update(rollout(path, dtype, shape["vocab_size"], device, args))
            print(json.dumps(result), flush=True)
        if not args.skip_train:
            for engine in ("hf", "vllm"):
                result.update(train(path, engine, Path(tmp)))
                print(json.dumps(result), flush=True)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
