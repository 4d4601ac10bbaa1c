"""The single-process run on the embedded default: ``relax train --in-process`` (no Ray, no data plane).

The reference that ``benchmarks/pipeline.py`` and ``benchmarks/async.py`` compare the Ray runtime
against, and the proof of the recipe in ``docs/en/embedded-default.md``: the shipped warm-up model, the
addition task, ``TinyEngine`` for sampling and ``TorchBackend`` for training, one rollout worker and one
actor rank in this process, the step of ``relax train`` (``relax.recipes.single_process``), so the
difference to the Ray runtime is Ray, Serve and TransferQueue and nothing else.

    python benchmarks/in_process.py --advantage-estimator grpo --steps 600
    python benchmarks/in_process.py --advantage-estimator gdpo --task addition-brevity --reward-weights 1 1 1 1 10

Prints steps/s, the first step where the trailing 20-step mean of ``correct`` reaches 0.9, the
per-component means over the first and last 10 % of steps, and greedy accuracy on all 100 problems.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Sequence

from relax.config.algorithm import AlgorithmConfig
from relax.config.run import RunConfig
from relax.models.tiny.weights import load_warmup_model
from relax.recipes.single_process import train_single_process
from relax.rollout.tasks import get_task
from relax.rollout.tasks.addition import greedy_accuracy
from relax.rollout.tiny.engine import TinyEngine


def recipe_config(reward_keys: Sequence[str], reward_weights: Sequence[float] | None = None, *,
                  n_samples_per_prompt: int = 8) -> AlgorithmConfig:
    """The algorithm configuration of the embedded-default recipe (PPO clip 0.2 / 0.28, token-mean loss)."""
    return AlgorithmConfig(
        n_samples_per_prompt=n_samples_per_prompt, reward_keys=tuple(reward_keys),
        reward_weights=None if reward_weights is None else tuple(reward_weights),
        eps_clip=0.2, eps_clip_high=0.28, loss_aggregation="token_mean",
    )


def final_greedy_accuracy(weights: dict, task_name: str) -> float:
    """The fraction of the 100 addition problems the trained policy answers correctly at temperature 0."""
    task = get_task(task_name)
    engine = TinyEngine(load_warmup_model(), task.make_tokenizer())
    engine.load_weights(weights)
    return greedy_accuracy(engine, task)


def run_in_process(
    spec: str,
    algorithm: AlgorithmConfig,
    *,
    task_name: str = "addition",
    steps: int = 600,
    prompts_per_step: int = 32,
    num_minibatches: int = 2,
    seed: int = 0,
    log_every: int = 50,
    output_dir: str | None = None,
) -> dict:
    """Train the warm-up model with ``spec`` for ``steps`` rollouts in this process; return the per-step
    metrics (``relax train``'s rows) and a summary. Without ``output_dir`` the run directory is a
    temporary one."""
    with tempfile.TemporaryDirectory(prefix="relax_in_process_") as tmp:
        config = RunConfig(
            advantage_estimator=spec, algorithm=algorithm, task=task_name, rollout_batch_size=prompts_per_step,
            num_steps_per_rollout=num_minibatches, num_rollout=steps, seed=seed, evaluate=False, progress=False,
            log_interval=log_every or steps, output_dir=output_dir or tmp,
        )
        result = train_single_process(config)
    history = [row for row in result.rows if "time/step_s" in row]
    greedy = final_greedy_accuracy(result.weights, task_name)
    elapsed = sum(row["time/step_s"] for row in history)
    summary = summarize(history, get_task(task_name).reward_keys, elapsed, greedy)
    return {"history": history, "summary": summary}


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
        description="relax train --in-process on the embedded default (the single-process reference)",
        allow_abbrev=False,
    )
    parser.add_argument("--advantage-estimator", default="grpo")
    parser.add_argument("--task", default="addition")
    parser.add_argument("--reward-weights", type=float, nargs="+", default=None)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write history + summary here")
    parser.add_argument("--smoke", action="store_true", help="3 steps: checks that the script runs")
    args = parser.parse_args(argv)
    if args.smoke:
        args.steps = 3
    algorithm = recipe_config(get_task(args.task).reward_keys, args.reward_weights)
    result = run_in_process(args.advantage_estimator, algorithm, task_name=args.task, steps=args.steps, seed=args.seed)
    print(json.dumps(result["summary"], indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f)
    return result["summary"]


if __name__ == "__main__":
    main()
