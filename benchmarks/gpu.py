"""relax on one GPU: the runs a user with a GPU starts first, and the references their speed is judged by.

One command, at most ``--budget-s`` seconds (default 450), nothing downloaded; the last line is JSON.

1. ``train_step`` (in this process, no Ray): one GRPO optimizer step of the same batch — 64 samples,
   prompts of 8..32 tokens, responses spread uniformly over 16..512 tokens — on a random
   Qwen2-0.5B-shaped model (float32 weights, bfloat16 autocast, AdamW, micro-batches of 8) three ways:
   ``bare`` (a plain loop: the transformers model, ``log_softmax``, GRPO's ``policy_loss``, backward,
   clipping, ``AdamW.step``: the reference), ``padded`` (``TorchBackend.train_step``) and ``packed``
   (``TorchBackend`` with ``--max-tokens-per-micro-batch`` = 8 x the padded width). Real tokens/s,
   MFU and peak memory each; ``padded_vs_bare`` and ``packed_vs_padded`` are tokens/s ratios
   (targets: >= 0.9 and >= 1.3).
2. ``engine``: ``benchmarks/hf_rollout.py`` on the same checkpoint in bfloat16, 64 prompts x 128 new
   tokens: the transformers engine against ``model.generate`` (target: >= 3x).
3. ``runs``: ``relax train`` as a user starts it, each in its own process with its own time limit, two
   at a time (the GPU is shared by the pair; each run's line says with which): the embedded default;
   GDPO on the random Qwen2-0.5B shape with the torch backend and ``--bf16``, padded and packed;
   the same on ``--backend megatron --bf16`` (TP=1); LoRA with a reward model served on the GPU. Per
   run: exit code, start-up, seconds per step, rollout tokens/s, train tokens/s (prompt and response
   tokens trained over the step's training time) and MFU, the actor's and the rollout worker's peak
   GPU memory (``torch.cuda.max_memory_allocated`` in those processes).

MFU = 6 x parameters x tokens / seconds / the GPU's peak dense bfloat16 FLOP/s (``--peak-tflops``;
known for H100/H200 = 989 and A100 = 312). The train phase of a run also holds the old-log-prob
pass and the weight publish, so its MFU is below the step's.

    python benchmarks/gpu.py                      # on a GPU machine
    python benchmarks/gpu.py --phases train_step  # one phase
    python benchmarks/gpu.py --smoke              # a tiny shape on the CPU: checks the script runs

``--smoke`` trains the embedded default and the tiny Qwen2 run in one process each (``--in-process``)
and checks the other runs' flags with ``--dry-run``, so the test suite sees every command.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QWEN2_05B = {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
             "intermediate_size": 4864, "vocab_size": 151936, "tie_word_embeddings": True}
SMOKE_SHAPE = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
               "intermediate_size": 128, "vocab_size": 512, "tie_word_embeddings": True}
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0}
PROMPT_WIDTH = 32
REWARD = '''"""Two components that vary between samples of a random model: the share of digits, and a stop."""
REWARD_KEYS = ("digits", "stops")


def reward(prompt, completion, label, metadata):
    stops = completion.endswith(("<eos>", "<|im_end|>"))
    text = completion.removesuffix("<eos>").removesuffix("<|im_end|>")
    return {"digits": sum(c.isdigit() for c in text) / max(len(text), 1), "stops": float(stops)}
'''


# -- the checkpoint ----------------------------------------------------------------------------------

def build_checkpoint(directory: Path, shape: dict, device: str) -> Path:
    """A random Qwen2 of ``shape`` (initialized on ``device``: seconds on a GPU, ~40 s for 0.5B on 16
    CPU cores) with the tests' word-level tokenizer, saved in bfloat16."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config

    sys.path.insert(0, str(ROOT / "tests" / "hf"))
    from tiny_checkpoints import build_tokenizer

    build_tokenizer(directory)
    config = Qwen2Config(**shape, max_position_embeddings=4096, rope_theta=1000000.0, rms_norm_eps=1e-6,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    # The tokenizer knows 48 words of the 151,936 ids: a random model would write one of them once in
    # ~25 samples of 128 tokens, every reward would be 0 and no group would train. Embedding rows 5x
    # longer (tied to the output layer) give those words about half of the probability (measured on
    # the CPU: 0.3% at 1x, 11% at 4x, 94% at 6x), so digits and stops vary within a group.
    known = len(AutoTokenizer.from_pretrained(str(directory)))
    with torch.no_grad():
        model.get_input_embeddings().weight[:known] *= 5.0
    model.save_pretrained(str(directory))
    return directory


def peak_tflops(device_name: str, override: float | None) -> float | None:
    if override:
        return override
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in device_name), None)


def mfu(params: int, tokens: float, seconds: float, peak: float | None) -> float | None:
    if not peak or not seconds:
        return None
    return round(6 * params * tokens / seconds / (peak * 1e12), 4)


# -- 1. the train step against a bare loop -----------------------------------------------------------

def make_batch(n: int, max_response: int, vocab: int, min_response: int):
    import torch

    from relax.models.batch import TokenBatch

    g = torch.Generator().manual_seed(0)
    prompt_lens = torch.randint(8, PROMPT_WIDTH + 1, (n,), generator=g)
    response_lens = torch.randint(min_response, max_response + 1, (n,), generator=g)
    prompt_mask = torch.arange(PROMPT_WIDTH)[None, :] >= PROMPT_WIDTH - prompt_lens[:, None]
    response_mask = torch.arange(max_response)[None, :] < response_lens[:, None]
    return TokenBatch(prompt_ids=torch.randint(3, vocab, (n, PROMPT_WIDTH), generator=g) * prompt_mask,
                      prompt_mask=prompt_mask,
                      response_ids=torch.randint(3, vocab, (n, max_response), generator=g) * response_mask,
                      response_mask=response_mask)


class BareLoop:
    """The reference: what a researcher writes by hand for one GRPO step, nothing of relax's runtime."""

    def __init__(self, model, algorithm, lr: float, bf16: bool):
        import torch

        self.model, self.algorithm, self.bf16 = model, algorithm, bf16
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=lr)

    def train_step(self, batch, old_log_probs, advantages, micro_batch_size: int) -> float:
        import torch

        from relax.algorithms import PolicyLossInputs

        device = next(self.model.parameters()).device
        ids, attention = batch.input_ids.to(device), batch.attention_mask.to(device)
        positions = (attention.long().cumsum(1) - 1).clamp(min=0)
        mask, old, adv = (t.to(device) for t in (batch.response_mask, old_log_probs, advantages))
        prompt_width, total = batch.prompt_ids.shape[1], 0.0
        tokens, sequences = float(mask.sum()), float(len(batch))
        for start in range(0, len(batch), micro_batch_size):
            rows = slice(start, start + micro_batch_size)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=self.bf16):
                logits = self.model(input_ids=ids[rows], attention_mask=attention[rows],
                                    position_ids=positions[rows]).logits
            scores = logits[:, prompt_width - 1: -1].float().log_softmax(-1)
            log_probs = scores.gather(-1, ids[rows, prompt_width:, None]).squeeze(-1) * mask[rows]
            out = self.algorithm.policy_loss(PolicyLossInputs(
                log_probs=log_probs, old_log_probs=old[rows], advantages=adv[rows], response_mask=mask[rows],
                global_num_tokens=tokens, global_num_sequences=sequences))
            out.loss.backward()
            total += float(out.loss.detach())
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return total


def train_step_phase(ckpt: Path, device: str, smoke: bool, peak: float | None) -> dict:
    import copy

    import torch

    from relax.algorithms import AlgorithmConfig
    from relax.algorithms.grpo import GRPO
    from relax.backends.torch_backend import TorchBackend
    from relax.models.hf.adapter import hf_forward_logits
    from relax.models.hf.loading import load_hf_model
    from relax.runtime.step.losses import policy_loss_fn

    n, mb, max_response, repeats = (8, 2, 24, 1) if smoke else (64, 8, 512, 3)
    base = load_hf_model(str(ckpt), dtype=torch.float32, device=device)
    params = sum(p.numel() for p in base.parameters())
    vocab = base.config.vocab_size
    batch = make_batch(n, max_response, vocab, min_response=4 if smoke else 16)
    algorithm = GRPO(AlgorithmConfig())
    bf16 = device == "cuda"  # the CPU's bfloat16 matmuls are slow enough to hide everything else
    width = batch.input_ids.shape[1]
    ways = {
        "bare": BareLoop(copy.deepcopy(base), algorithm, lr=1e-6, bf16=bf16),
        "padded": TorchBackend(copy.deepcopy(base), lr=1e-6, forward_logits=hf_forward_logits, bf16=bf16),
        "packed": TorchBackend(base, lr=1e-6, forward_logits=hf_forward_logits, bf16=bf16,
                               max_tokens_per_micro_batch=mb * width),
    }
    # The batch, the old log-probs and the advantages arrive on the CPU, as from the data plane.
    old = ways["padded"].compute_log_probs(batch, micro_batch_size=mb).log_probs.detach().cpu()
    g = torch.Generator().manual_seed(1)
    advantages = torch.randn(n, 1, generator=g).expand_as(batch.response_mask) * batch.response_mask
    loss_fn = policy_loss_fn(algorithm, old_log_probs=old, advantages=advantages, response_mask=batch.response_mask,
                             global_num_tokens=float(batch.response_mask.sum()), global_num_sequences=float(n))

    def step(name: str) -> float:
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        way = ways[name]
        if name == "bare":
            way.train_step(batch, old, advantages, mb)
        else:
            way.train_step(batch, loss_fn, micro_batch_size=mb, with_entropy=False)
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    times: dict[str, list[float]] = {name: [] for name in ways}
    peaks: dict[str, float] = {}
    for name in ways:  # the warm-up step of each, and its memory peak
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        step(name)
        if device == "cuda":
            peaks[name] = round(torch.cuda.max_memory_allocated() / 2**20)
    for _ in range(repeats):  # taken alternately, so a slow moment of the machine hits all three
        for name in ways:
            times[name].append(step(name))
    real = int(batch.attention_mask.sum())
    out = {"params": params, "samples": n, "micro_batch_size": mb, "real_tokens": real,
           "padded_tokens": int(batch.input_ids.numel()), "bf16": bf16}
    for name, ts in times.items():
        s = statistics.median(ts)
        out[name] = {"step_s": round(s, 4), "tokens_per_s": round(real / s, 1), "mfu": mfu(params, real, s, peak),
                     **({"peak_mib": peaks[name]} if name in peaks else {})}
    out["padded_vs_bare"] = round(out["padded"]["tokens_per_s"] / out["bare"]["tokens_per_s"], 3)
    out["packed_vs_padded"] = round(out["packed"]["tokens_per_s"] / out["padded"]["tokens_per_s"], 3)
    return out


# -- 2. the transformers engine against model.generate -------------------------------------------------

def engine_phase(ckpt: Path, device: str, smoke: bool, limit: float, work: Path) -> dict:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "hf_rollout.py")]
    cmd += ["--smoke"] if smoke else ["--checkpoint", str(ckpt), "--dtype", "bfloat16", "--batch", "64",
                                      "--prompt-len", "32", "--max-new-tokens", "128", "--repeats", "2"]
    result = run_command("engine", cmd, limit, work)
    result.update(last_json(work / "engine.log"))
    return result


def last_json(log: Path) -> dict:
    """The JSON object a benchmark printed last (one line, or indented over several)."""
    lines = log.read_text().split("--- stderr ---")[0].splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("{"):
            try:
                return json.loads("\n".join(lines[i:]))
            except json.JSONDecodeError:
                continue
    return {}


# -- 3. relax train, as a user starts it ---------------------------------------------------------------

def run_command(name: str, cmd: list[str], limit: float, work: Path, env: dict | None = None) -> dict:
    t0 = time.time()
    try:
        p = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=max(limit, 1))
        rc, so, se = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        rc = "timeout"
        so, se = (x.decode(errors="replace") if isinstance(x, bytes) else (x or "") for x in (e.stdout, e.stderr))
    (work / f"{name}.log").write_text(f"$ {' '.join(cmd)}\n{so}\n--- stderr ---\n{se}")
    result = {"rc": rc, "wall_s": round(time.time() - t0, 1)}
    if rc != 0:
        result["tail"] = [x[:300] for x in (se + so).splitlines() if x.strip()][-4:]
    for line in (se + so).splitlines():
        if line.startswith("relax: start-up "):
            result["startup_s"] = float(line.split()[2].rstrip("s"))
    return result


def run_summary(out_dir: Path, params: int | None, peak: float | None) -> dict:
    """Means over the steps after the first (the first holds one-time costs) of a run's metrics.jsonl."""
    path = out_dir / "metrics.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    steps = [r for r in rows if "time/step_s" in r]
    later = steps[1:] or steps

    def mean(key):
        values = [r[key] for r in later if isinstance(r.get(key), (int, float))]
        return round(sum(values) / len(values), 4) if values else None

    s = {"steps": len(steps), "step_s": mean("time/step_s"), "rollout_tokens_per_s": mean("rollout/tokens_per_s"),
         "train_tokens_per_s": mean("perf/train_tokens_per_s"),
         "actor_gpu_peak_mib": peak_of("perf/actor_gpu_peak_mib", steps),
         "rollout_gpu_peak_mib": peak_of("perf/rollout_gpu_peak_mib", steps)}
    if params and s["train_tokens_per_s"]:
        s["train_mfu"] = mfu(params, s["train_tokens_per_s"], 1.0, peak)
    return s


def peak_of(key: str, rows: list[dict]) -> float | None:
    return max((r[key] for r in rows if key in r), default=None)


def relax_runs(ckpt: Path, rm: Path, work: Path, steps: int, smoke: bool) -> dict[str, list[str]]:
    """Each run's ``relax train`` arguments (without the output directory)."""
    data = work / "prompts.jsonl"
    data.write_text("".join(json.dumps({"q": f"what is {i} + {i} ?", "a": 2 * i}) + "\n" for i in range(64)))
    (work / "gpu_reward.py").write_text(REWARD)
    qwen = ["--advantage-estimator", "gdpo", "--hf-checkpoint", str(ckpt), "--bf16", "--rollout-engine", "hf",
            "--prompt-data", str(data), "--input-key", "q", "--label-key", "a",
            "--custom-rm-path", "gpu_reward:reward", "--reward-keys", "digits", "stops",
            "--num-rollout", str(steps), "--rollout-batch-size", "4" if smoke else "16",
            "--n-samples-per-prompt", "4" if smoke else "8", "--global-batch-size", "16" if smoke else "128",
            "--rollout-max-response-len", "16" if smoke else "128", "--rollout-temperature", "1.0",
            "--lr", "1e-6", "--no-progress", "--no-eval"]
    return {
        "default": ["--advantage-estimator", "gdpo", "--num-rollout", "3" if smoke else "40", "--no-progress"],
        "torch_bf16": qwen,
        "torch_bf16_packed": [*qwen, "--max-tokens-per-micro-batch", "8192"],
        # the fast start on one GPU (no Ray), and the weight route as a torch.distributed broadcast
        "torch_bf16_in_process": [*qwen, "--in-process"],
        "torch_bf16_collective": [*qwen, "--weight-transport", "collective"],
        "megatron_bf16": [*qwen, "--backend", "megatron", "--tensor-model-parallel-size", "1"],
        "lora_reward_model": [*qwen[:qwen.index("--reward-keys")], "--reward-keys", "digits", "stops", "rm",
                              *qwen[qwen.index("--reward-keys") + 3:], "--lora-rank", "16",
                              "--reward-model-path", str(rm), "--reward-model-cpus", "0.25"],
    }


RUN_ORDER = ("default", "megatron_bf16", "torch_bf16", "lora_reward_model", "torch_bf16_packed",
             "torch_bf16_in_process", "torch_bf16_collective")
LIMITS = {"default": 120, "torch_bf16": 150, "torch_bf16_packed": 130, "megatron_bf16": 170, "lora_reward_model": 150,
          "torch_bf16_in_process": 120, "torch_bf16_collective": 150}


def runs_phase(ckpt: Path, rm: Path, work: Path, deadline: float, steps: int, smoke: bool, params: int,
               peak: float | None, parallel: int = 2) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(work), str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0",
           "PYTHONUNBUFFERED": "1"}
    args = relax_runs(ckpt, rm, work, steps, smoke)
    results: dict[str, dict] = {}

    def one(name: str, partner: str | None) -> None:
        remaining = deadline - time.time()
        if remaining < 30:
            results[name] = {"rc": None, "skipped": f"the budget had {remaining:.0f}s left"}
            return
        out_dir = work / f"run-{name}"
        cmd = [sys.executable, "-m", "relax", "train", *args[name], "--output-dir", str(out_dir)]
        if smoke:  # the CPU: two runs in one process each, the rest checked as far as --dry-run goes
            cmd += ["--in-process"] if name in ("default", "torch_bf16") else ["--dry-run"]
        r = run_command(name, cmd, min(LIMITS[name] * (3 if smoke else 1), remaining), work, env)
        r.update(run_summary(out_dir, None if name == "default" else params, peak))
        results[name] = {**r, "shared_gpu_with": partner}

    def lane(mine: tuple[str, ...], others: tuple[str, ...]) -> None:
        for name in mine:  # the runs of the other lanes share the GPU with it, as far as their times overlap
            one(name, "/".join(others) or None)

    names = [x for x in RUN_ORDER if _importable("megatron.core") or x != "megatron_bf16"]
    if len(names) < len(RUN_ORDER):
        results["megatron_bf16"] = {"rc": None, "skipped": "megatron-core is not installed"}
    lanes = [tuple(names[i::parallel]) for i in range(parallel)] if not smoke else [tuple(names)]
    threads = [threading.Thread(target=lane, args=(mine, tuple(x for x in names if x not in mine)))
               for mine in lanes if mine]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def _importable(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--phases", default="train_step,engine,runs")
    parser.add_argument("--budget-s", type=float, default=450.0, help="the whole command's time (default 450)")
    parser.add_argument("--steps", type=int, default=3, help="training steps of each Qwen2 run (default 3)")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="the GPU's peak dense bfloat16 TFLOP/s for MFU (default: known for H100/H200/A100)")
    parser.add_argument("--parallel", type=int, default=2,
                        help="relax train runs at a time on the one GPU (default 2; the CPU's --smoke: 1)")
    parser.add_argument("--out", default=None, help="a directory for summary.json and the runs' logs")
    parser.add_argument("--smoke", action="store_true", help="a tiny shape on the CPU: checks that it runs")
    args = parser.parse_args(argv)
    t_start = time.time()
    deadline = t_start + args.budget_s
    import torch

    device = "cuda" if torch.cuda.is_available() and not args.smoke else "cpu"
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    peak = peak_tflops(name, args.peak_tflops) if device == "cuda" else None
    work = Path(args.out or tempfile.mkdtemp(prefix="relax-gpu-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    phases = args.phases.split(",")
    summary: dict = {"device": name, "torch": torch.__version__, "peak_bf16_tflops": peak}
    t = time.time()
    ckpt = build_checkpoint(work / "qwen2", SMOKE_SHAPE if args.smoke else QWEN2_05B, device)
    from relax.models.hf.tiny_random import build_tiny_reward_model

    rm = build_tiny_reward_model(work / "rm")
    summary["checkpoint_build_s"] = round(time.time() - t, 1)
    params = None
    def keep() -> None:  # after every phase: a command cut off by its time limit still leaves its numbers
        (work / "summary.json").write_text(json.dumps(summary, indent=1))

    keep()
    if "train_step" in phases:
        summary["train_step"] = train_step_phase(ckpt, device, args.smoke, peak)
        keep()
        params = summary["train_step"]["params"]
        if device == "cuda":
            torch.cuda.empty_cache()
    if params is None:
        from transformers import AutoConfig, AutoModelForCausalLM

        with torch.device("meta"):
            params = sum(p.numel() for p in AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(ckpt)).parameters())
    if "engine" in phases:
        summary["engine"] = engine_phase(ckpt, device, args.smoke, min(150.0, deadline - time.time()), work)
        keep()
    if "runs" in phases:
        summary["runs"] = runs_phase(ckpt, rm, work, deadline, args.steps, args.smoke, params, peak, args.parallel)
    summary["wall_s"] = round(time.time() - t_start, 1)
    keep()
    print(f"relax gpu check: {name}; logs and summary.json in {work}", file=sys.stderr)
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
