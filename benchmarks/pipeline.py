"""Framework overhead of ``relax train``: the Ray runtime vs the same run in one process.

The same model (the shipped warm-up TinyCausalLM), task (addition, 4 reward components), batch
(32 prompts x 8 samples, two mini-batches) and algorithm configuration run

(a) through the runtime, ``relax.runtime.driver.train.run(config)`` (Ray + Serve + TransferQueue), and
(b) as ``relax train --in-process`` (``benchmarks/in_process.py``: one process, no Ray),

measured in the same invocation (bare, runtime, bare again, so that a change of machine load hits
both sides). Reported:

- per-step time, median over the steps after a short warm-up, and the overhead share
  ``(runtime - bare) / runtime`` (target: <= 25 % at the default batch size);
- the runtime's start-up time (Ray, TransferQueue, Serve, workers) and total wall time;
- rollout tokens/s: generated tokens / generation time inside the rollout worker over the last 20
  steps, against a bare KV-cached sampling loop (``TinyEngine.generate`` on the same batch shape in
  this process) with the runtime's final weights, so both sample equally long responses (tokens/s
  depends on response length: a decode step costs the same however many rows are still live).

    python benchmarks/pipeline.py [--algorithm gdpo] [--steps 100]
    python benchmarks/pipeline.py --smoke   # 3 steps, for the test suite (no numbers to read)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from in_process import recipe_config, run_in_process

from relax.algorithms import AlgorithmConfig
from relax.config.run import RunConfig
from relax.models.tiny.weights import load_warmup_model
from relax.rollout.base import SamplingParams
from relax.rollout.tasks import get_task
from relax.rollout.tiny.engine import TinyEngine
from relax.runtime.driver.train import run

PROMPTS, SAMPLES, MINIBATCHES = 32, 8, 2
WARMUP_STEPS = 5


def _median_after_warmup(values):
    values = list(values)  # a generator can be read once
    return statistics.median(values[WARMUP_STEPS:] or values)


def bare(algo: str, steps: int) -> dict:
    keys = get_task("addition").reward_keys
    algorithm = recipe_config(keys, n_samples_per_prompt=SAMPLES)
    t0 = time.perf_counter()
    out = run_in_process(algo, algorithm, steps=steps, prompts_per_step=PROMPTS, num_minibatches=MINIBATCHES,
                        seed=0, log_every=0)
    hist = out["history"]
    return {"step_s": _median_after_warmup(r["time/step_s"] for r in hist),
            "rollout_s": _median_after_warmup(r["time/rollout_s"] for r in hist), "wall_s": time.perf_counter() - t0}


def runtime(algo: str, steps: int, out_dir: str) -> dict:
    keys = get_task("addition").reward_keys
    config = RunConfig(
        advantage_estimator=algo,
        # the in-process run's algorithm configuration (the recipe of docs/en/embedded-default.md)
        algorithm=AlgorithmConfig(n_samples_per_prompt=SAMPLES, reward_keys=keys, eps_clip=0.2, eps_clip_high=0.28,
                                  loss_aggregation="token_mean"),
        rollout_batch_size=PROMPTS,
        num_steps_per_rollout=MINIBATCHES,
        num_rollout=steps,
        save_interval=steps,
        seed=0,
        output_dir=out_dir,
        progress=False,
    )
    t0 = time.perf_counter()
    summary = run(config)
    wall = time.perf_counter() - t0
    rows = [json.loads(line) for line in Path(summary.metrics_path).read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "time/step_s" in r]  # training steps: not the step-0 evaluation row
    gen_tokens = sum(r["rollout/generated_tokens"] for r in rows[-20:])
    gen_time = sum(r["time/rollout/generate_s"] for r in rows[-20:])
    weights = torch.load(summary.checkpoint, weights_only=False)["actor"]["backend"]["model"]
    # timings every step logs (the final step also carries the evaluation's time/eval_s)
    timings = sorted(set.intersection(*(set(r) for r in rows)))
    breakdown = {k: _median_after_warmup(r[k] for r in rows) for k in timings if k.startswith("time/")}
    return {
        "step_s": _median_after_warmup(r["time/step_s"] for r in rows),
        "startup_s": summary.startup_s,
        "train_s": summary.train_s,
        "wall_s": wall,
        "rollout_tokens_per_s": gen_tokens / gen_time,
        "rollout_compute_s": _median_after_warmup(
            r["time/rollout/generate_s"] + r["time/rollout/reward_s"] for r in rows),
        "final_weights": weights,
        "breakdown_ms": {k: round(1000 * v, 1) for k, v in sorted(breakdown.items())},
    }


def bare_sampling_tokens_per_s(weights, iterations: int = 30) -> float:
    task = get_task("addition")
    engine = TinyEngine(load_warmup_model(), task.make_tokenizer())
    engine.load_weights(weights)
    prompts = task.make_prompts(0).next_batch(PROMPTS)
    ids = [engine.tokenizer.encode(p.text) for p in prompts for _ in range(SAMPLES)]
    params = SamplingParams(temperature=1.0, max_new_tokens=task.max_new_tokens)
    g = torch.Generator().manual_seed(0)
    engine.generate(ids, params, g)  # warm-up
    tokens, elapsed = 0, 0.0
    for _ in range(iterations):
        t0 = time.perf_counter()
        gen = engine.generate(ids, params, g)
        elapsed += time.perf_counter() - t0
        tokens += int(gen.batch.response_mask.sum())
    return tokens / elapsed


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--algorithm", default="gdpo")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--smoke", action="store_true",
                        help="3 steps: checks that the script runs, measures nothing")
    args = parser.parse_args(argv)
    if args.smoke:
        args.steps = 3
    torch.set_num_threads(1)  # the runtime's workers use one thread each
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    bare1 = bare(args.algorithm, args.steps)
    with tempfile.TemporaryDirectory(prefix="relax_bench_") as tmp:
        rt = runtime(args.algorithm, args.steps, tmp)
    bare2 = bare(args.algorithm, args.steps)
    bare_step = (bare1["step_s"] + bare2["step_s"]) / 2
    sampling = bare_sampling_tokens_per_s(rt["final_weights"], iterations=2 if args.smoke else 30)
    result = {
        "algorithm": args.algorithm,
        "steps": args.steps,
        "batch": f"{PROMPTS} prompts x {SAMPLES} samples, {MINIBATCHES} mini-batches",
        "bare_step_ms": [round(1000 * bare1["step_s"], 1), round(1000 * bare2["step_s"], 1)],
        "runtime_step_ms": round(1000 * rt["step_s"], 1),
        "step_time_ratio_runtime_over_bare": round(rt["step_s"] / bare_step, 3),
        "framework_overhead_share": round((rt["step_s"] - bare_step) / rt["step_s"], 3),
        "overhead_target_met(<=0.25)": (rt["step_s"] - bare_step) / rt["step_s"] <= 0.25,
        "rollout_generate_plus_score_ms": {"runtime": round(1000 * rt["rollout_compute_s"], 1),
                                           "bare": round(500 * (bare1["rollout_s"] + bare2["rollout_s"]), 1)},
        "runtime_startup_s": round(rt["startup_s"], 1),
        "runtime_wall_s": round(rt["wall_s"], 1),
        "bare_wall_s": [round(bare1["wall_s"], 1), round(bare2["wall_s"], 1)],
        "rollout_tokens_per_s": round(rt["rollout_tokens_per_s"]),
        "bare_sampling_tokens_per_s": round(sampling),
        "rollout_sampling_ratio": round(rt["rollout_tokens_per_s"] / sampling, 3),
        "runtime_breakdown_median_ms": rt["breakdown_ms"],
    }
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
