"""The bare single-process RL loop on the embedded default (no Ray, no data plane).

The reference that ``benchmarks/pipeline.py`` compares ``relax train`` against, and the proof of the
recipe in ``docs/en/embedded-default.md``: the shipped warm-up model, the addition task,
``TinyEngine`` for sampling and ``TorchBackend`` for training, driven by one ``RLAlgorithm`` object
exactly as the pipeline drives it (group filter -> ``normalize_rewards`` -> ``compute_advantages``
with ``segment_sizes`` -> one optimizer step per mini-batch with ``policy_loss``).

    python benchmarks/bare_loop.py --advantage-estimator grpo --steps 600
    python benchmarks/bare_loop.py --advantage-estimator gdpo --task addition-brevity --reward-weights 1 1 1 1 10

The loop itself is ``relax.recipes.local_loop.train_local``; this script adds the benchmark summary.

Prints steps/s, the first step where the trailing 20-step mean of ``correct`` reaches 0.9, the
per-component means over the first and last 10 % of steps, and greedy accuracy on all 100 problems.
"""

from __future__ import annotations

import argparse
import json

import torch

from relax.algorithms import load_algorithm
from relax.rollout.tasks import get_task
from relax.recipes.local_loop import recipe_config, train_local


def make_algorithm(spec: str, reward_keys, reward_weights=None, n_samples_per_prompt: int = 8):
    """The recipe's algorithm (``relax.recipes.local_loop.recipe_config``) as an instance."""
    return load_algorithm(spec)(
        recipe_config(reward_keys, reward_weights, n_samples_per_prompt=n_samples_per_prompt)
    )


def run_bare_loop(
    algorithm,
    *,
    task_name: str = "addition",
    steps: int = 600,
    prompts_per_step: int = 32,
    n_samples: int = 8,
    num_minibatches: int = 2,
    lr: float = 3e-4,
    clip_grad: float = 1.0,
    temperature: float = 1.0,
    seed: int = 0,
    filter_groups: bool = True,
    log_every: int = 50,
) -> dict:
    """Train the warm-up model for ``steps`` rollouts; return per-step metrics and a summary.

    A thin wrapper of ``relax.recipes.local_loop.train_local`` without the multi-reward diagnostics
    (the Ray runtime does not compute them either, so ``benchmarks/pipeline.py`` compares like with
    like) and without touching the thread count (the caller sets it).
    """
    task = get_task(task_name)
    result = train_local(
        task,
        algorithm,
        steps=steps,
        seed=seed,
        prompts_per_step=prompts_per_step,
        n_samples=n_samples,
        num_minibatches=num_minibatches,
        lr=lr,
        clip_grad=clip_grad,
        temperature=temperature,
        filter_groups=filter_groups,
        diagnostics=False,
        num_threads=None,
        log_every=log_every,
    )
    summary = summarize(result.history, task.reward_keys, result.seconds, result.greedy_accuracy)
    return {"history": result.history, "summary": summary}


def summarize(history: list[dict], keys, elapsed: float, greedy: float) -> dict:
    n = len(history)
    tenth = max(1, n // 10)
    mean = lambda rows, k: sum(r[f"reward/{k}/mean"] for r in rows) / len(rows)
    correct = [r["reward/correct/mean"] for r in history]
    reached = next((i + 1 for i in range(19, n) if sum(correct[i - 19 : i + 1]) / 20 >= 0.9), None)
    return {
        "steps": n,
        "seconds": elapsed,
        "steps_per_s": n / elapsed,
        "step_correct_ge_0.9_trailing20": reached,
        "first_10pct": {k: mean(history[:tenth], k) for k in keys},
        "last_10pct": {k: mean(history[-tenth:], k) for k in keys},
        "greedy_accuracy_100": greedy,
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(
        description="bare single-process RL loop on the embedded default", allow_abbrev=False
    )
    parser.add_argument("--advantage-estimator", default="grpo")
    parser.add_argument("--task", default="addition")
    parser.add_argument("--reward-weights", type=float, nargs="+", default=None)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--no-group-filter", action="store_true", help="train on every group, even constant ones"
    )
    parser.add_argument("--json", help="write history + summary here")
    parser.add_argument("--smoke", action="store_true", help="3 steps: checks that the script runs")
    args = parser.parse_args(argv)
    if args.smoke:
        args.steps = 3
    torch.set_num_threads(args.threads)
    task = get_task(args.task)
    algorithm = make_algorithm(args.advantage_estimator, task.reward_keys, args.reward_weights)
    result = run_bare_loop(
        algorithm,
        task_name=args.task,
        steps=args.steps,
        seed=args.seed,
        filter_groups=not args.no_group_filter,
    )
    print(json.dumps(result["summary"], indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f)
    return result["summary"]


if __name__ == "__main__":
    main()
