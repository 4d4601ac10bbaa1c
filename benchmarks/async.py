"""Asynchronous training against the synchronous schedule, on the embedded default, in one run.

Four ways to train the same model, task, batch (32 prompts x 8 samples, two mini-batches) and
algorithm configuration, measured in this invocation so that the machine's load hits all of them:

(a) the synchronous run in one process (``benchmarks/in_process.py``: ``--in-process``, no Ray);
(b) the synchronous runtime (``relax train``);
(c) ``--fully-async --max-staleness 1``;
(d) the same with ``--rollout-num-workers 2``.

Reported per run: the median step time after a short warm-up and steps/s, ratios against (b) and
(a), and reward against wall-clock training time: the training time at which the trailing-10-step
mean of ``correct`` first reaches 0.5, and that mean at the shortest run's total training time.
Start-up is excluded from the wall-clock curves (it is reported separately).

    python benchmarks/async.py [--algorithm gdpo] [--steps 150]
    python benchmarks/async.py --smoke      # 3 steps of each, for the test suite (no numbers to read)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from in_process import recipe_config, run_in_process

from relax.algorithms import AlgorithmConfig
from relax.config.run import RunConfig
from relax.rollout.tasks import get_task
from relax.runtime.driver.train import run

PROMPTS, SAMPLES, MINIBATCHES = 32, 8, 2
WARMUP_STEPS = 5
TARGET = 0.5
WINDOW = 10


def _curve(rows: list[dict]) -> list[tuple[float, float]]:
    """(training seconds so far, trailing-WINDOW mean of correct) after each step."""
    out, elapsed = [], 0.0
    for i, row in enumerate(rows):
        elapsed += row["time/step_s"]
        window = rows[max(0, i + 1 - WINDOW) : i + 1]
        out.append((elapsed, sum(r["reward/correct/mean"] for r in window) / len(window)))
    return out


def _summary(rows: list[dict], startup_s: float | None = None) -> dict:
    step_s = statistics.median(r["time/step_s"] for r in rows[WARMUP_STEPS:] or rows)
    curve = _curve(rows)
    reached = next((t for t, c in curve if c >= TARGET), None)
    out = {"step_ms": round(1000 * step_s, 1), "steps_per_s": round(1 / step_s, 2),
           "train_s": round(curve[-1][0], 1), f"train_s_to_correct_{TARGET}": None if reached is None else round(reached, 1),
           "curve": curve}
    if startup_s is not None:
        out["startup_s"] = round(startup_s, 1)
    staleness = [r["async/staleness_max"] for r in rows if "async/staleness_max" in r]
    if staleness:
        out["staleness_max"] = max(staleness)
    return out


def bare(algo: str, steps: int) -> dict:
    keys = get_task("addition").reward_keys
    algorithm = recipe_config(keys, n_samples_per_prompt=SAMPLES)
    out = run_in_process(algo, algorithm, steps=steps, prompts_per_step=PROMPTS, num_minibatches=MINIBATCHES,
                        seed=0, log_every=0)
    return _summary(out["history"])


def runtime(algo: str, steps: int, out_dir: str, **mode) -> dict:
    keys = get_task("addition").reward_keys
    config = RunConfig(
        advantage_estimator=algo,
        # the in-process run's algorithm configuration (the recipe of docs/en/embedded-default.md)
        algorithm=AlgorithmConfig(n_samples_per_prompt=SAMPLES, reward_keys=keys, eps_clip=0.2, eps_clip_high=0.28,
                                  loss_aggregation="token_mean"),
        rollout_batch_size=PROMPTS, num_steps_per_rollout=MINIBATCHES, num_rollout=steps, seed=0,
        output_dir=out_dir, progress=False, **mode,
    )
    summary = run(config)
    return _summary(training_rows(summary.metrics_path), summary.startup_s)


def training_rows(metrics_path) -> list[dict]:
    """The training steps of a run's ``metrics.jsonl``: not the evaluation before training, which is
    logged first as a step-0 row without step times."""
    rows = [json.loads(line) for line in Path(metrics_path).read_text().splitlines() if line.strip()]
    return [row for row in rows if "time/step_s" in row]


def _at(curve, seconds: float) -> float:
    """The trailing mean of correct at ``seconds`` of training (the last point not after it)."""
    return next((c for t, c in reversed(curve) if t <= seconds), curve[0][1])


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--algorithm", default="gdpo")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--smoke", action="store_true",
                        help="3 steps per run: checks that the script runs, measures nothing")
    args = parser.parse_args(argv)
    if args.smoke:
        args.steps = 3
    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    runs = {"bare_sync": bare(args.algorithm, args.steps)}
    modes = {
        "runtime_sync": {},
        "async_k1": {"fully_async": True, "max_staleness": 1},
        "async_k1_2_rollout_workers": {"fully_async": True, "max_staleness": 1, "rollout_num_workers": 2},
    }
    for name, mode in modes.items():
        with tempfile.TemporaryDirectory(prefix="relax_async_bench_") as tmp:
            runs[name] = runtime(args.algorithm, args.steps, tmp, **mode)
    equal_time = min(r["train_s"] for r in runs.values())
    sync = runs["runtime_sync"]
    for r in runs.values():
        r[f"correct_at_{equal_time:.0f}s"] = round(_at(r.pop("curve"), equal_time), 3)
        r["steps_per_s_over_runtime_sync"] = round(r["steps_per_s"] / sync["steps_per_s"], 2)
        r["step_time_over_bare_sync"] = round(r["step_ms"] / runs["bare_sync"]["step_ms"], 2)
    result = {
        "algorithm": args.algorithm, "steps": args.steps,
        "batch": f"{PROMPTS} prompts x {SAMPLES} samples, {MINIBATCHES} mini-batches",
        "targets": {
            "async_k1 steps/s >= 1.3x runtime_sync": runs["async_k1"]["steps_per_s_over_runtime_sync"] >= 1.3,
            "async_k1 step time <= bare_sync": runs["async_k1"]["step_time_over_bare_sync"] <= 1.0,
            "async_k1 correct >= runtime_sync at equal wall time":
                runs["async_k1"][f"correct_at_{equal_time:.0f}s"] >= sync[f"correct_at_{equal_time:.0f}s"],
        },
        "runs": runs,
    }
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
