"""The bare single-process RL loop on the embedded default (no Ray, no data plane).

The reference that ``benchmarks/pipeline.py`` compares ``relax train`` against, and the proof of the
recipe in ``shared/notes/embedded-default.md``: the shipped warm-up model, the addition task,
``TinyEngine`` for sampling and ``TorchBackend`` for training, driven by one ``RLAlgorithm`` object
exactly as the pipeline drives it (group filter -> ``normalize_rewards`` -> ``compute_advantages``
with ``segment_sizes`` -> one optimizer step per mini-batch with ``policy_loss``).

    python benchmarks/bare_loop.py --advantage-estimator grpo --steps 600
    python benchmarks/bare_loop.py --advantage-estimator gdpo --task addition-brevity --reward-weights 1 1 1 1 10

Prints steps/s, the first step where the trailing 20-step mean of ``correct`` reaches 0.9, the
per-component means over the first and last 10 % of steps, and greedy accuracy on all 100 problems.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from relax.algorithms import AdvantageInputs, AlgorithmConfig, PolicyLossInputs, load_algorithm
from relax.backends.base import TokenBatch
from relax.backends.torch_backend import TorchBackend
from relax.rollout.base import SamplingParams
from relax.rollout.tasks import get_task
from relax.rollout.tasks.addition import all_problems
from relax.rollout.tiny.engine import TinyEngine
from relax.rollout.tiny.warmup import load_warmup_model


def make_algorithm(spec: str, reward_keys, reward_weights=None, n_samples_per_prompt: int = 8):
    config = AlgorithmConfig(
        n_samples_per_prompt=n_samples_per_prompt,
        reward_keys=tuple(reward_keys),
        reward_weights=reward_weights,
        eps_clip=0.2,
        eps_clip_high=0.28,
        loss_aggregation="token_mean",
    )
    return load_algorithm(spec)(config)


def greedy_accuracy(engine: TinyEngine, task) -> float:
    problems = all_problems()
    tok = engine.tokenizer
    gen = engine.generate([tok.encode(p.text) for p in problems], SamplingParams(temperature=0.0, max_new_tokens=task.max_new_tokens))
    texts = engine.decode_responses(gen)
    return sum(task.reward_fn(p.text, c, p.label, p.metadata)["correct"] for p, c in zip(problems, texts)) / len(problems)


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
    """Train the warm-up model for ``steps`` rollouts; return per-step metrics and a summary."""
    task = get_task(task_name)
    torch.manual_seed(seed)
    model = load_warmup_model()
    engine = TinyEngine(load_warmup_model(), task.make_tokenizer())
    backend = TorchBackend(model, lr=lr, clip_grad=clip_grad, temperature=temperature)
    engine.load_weights(backend.export_weights())
    prompts_source = task.make_prompts(seed)
    generator = torch.Generator().manual_seed(seed)
    params = SamplingParams(temperature=temperature, max_new_tokens=task.max_new_tokens)
    keys = task.reward_keys
    history = []
    start = time.perf_counter()
    for step in range(1, steps + 1):
        t0 = time.perf_counter()
        prompts = prompts_source.next_batch(prompts_per_step)
        samples = [p for p in prompts for _ in range(n_samples)]
        group_ids = torch.arange(prompts_per_step).repeat_interleave(n_samples)
        gen = engine.generate([engine.tokenizer.encode(p.text) for p in samples], params, generator)
        texts = engine.decode_responses(gen)
        scored = [task.reward_fn(p.text, c, p.label, {**p.metadata, "sample_index": i % n_samples})
                  for i, (p, c) in enumerate(zip(samples, texts))]
        rewards = torch.tensor([[s[k] for k in keys] for s in scored], dtype=torch.float32)
        t_rollout = time.perf_counter() - t0

        # Like the pipeline's rollout: drop groups that carry no signal for this algorithm.
        keep = algorithm.group_has_signal(rewards, group_ids) if filter_groups else torch.ones(len(samples), dtype=torch.bool)
        record = {"step": step, **{f"reward/{k}/mean": float(rewards[:, i].mean()) for i, k in enumerate(keys)},
                  "kept_frac": float(keep.float().mean())}
        if keep.any():
            rows = keep.nonzero().squeeze(1)
            batch: TokenBatch = gen.batch.select(rows)
            scalar = algorithm.normalize_rewards(rewards[rows], group_ids[rows])
            # Mini-batches are whole prompt groups: kept rows are grouped, so split on group edges.
            kept_groups = group_ids[rows].unique_consecutive()
            chunks = torch.tensor_split(kept_groups, min(num_minibatches, len(kept_groups)))
            sizes = tuple(int(torch.isin(group_ids[rows], c).sum()) for c in chunks)
            advantages, _ = algorithm.compute_advantages(
                AdvantageInputs(rewards=scalar, response_mask=batch.response_mask, segment_sizes=sizes)
            )
            old = backend.compute_log_probs(batch).log_probs
            offset = 0
            for size in sizes:
                part = slice(offset, offset + size)
                offset += size
                mini = batch.select(part)
                n_tokens = float(mini.response_mask.sum())

                def loss_fn(lp, rows, part=part, mini=mini, n_tokens=n_tokens):
                    sl = lambda x: x[part][rows]  # noqa: E731
                    return algorithm.policy_loss(PolicyLossInputs(
                        log_probs=lp.log_probs, old_log_probs=sl(old), advantages=sl(advantages),
                        response_mask=mini.response_mask[rows], entropy=lp.entropy,
                        global_num_tokens=n_tokens, global_num_sequences=float(len(mini)),
                    ))

                record.update(backend.train_step(mini, loss_fn))
            engine.load_weights(backend.export_weights())
        record["time/step_s"] = time.perf_counter() - t0
        record["time/rollout_s"] = t_rollout
        history.append(record)
        if log_every and step % log_every == 0:
            print(f"step {step:4d}  " + "  ".join(f"{k}={record[f'reward/{k}/mean']:.3f}" for k in keys)
                  + f"  {step / (time.perf_counter() - start):.1f} steps/s", flush=True)
    elapsed = time.perf_counter() - start
    return {"history": history, "summary": summarize(history, keys, elapsed, greedy_accuracy(engine, task))}


def summarize(history: list[dict], keys, elapsed: float, greedy: float) -> dict:
    n = len(history)
    tenth = max(1, n // 10)
    mean = lambda rows, k: sum(r[f"reward/{k}/mean"] for r in rows) / len(rows)  # noqa: E731
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
    parser = argparse.ArgumentParser(description="bare single-process RL loop on the embedded default")
    parser.add_argument("--advantage-estimator", default="grpo")
    parser.add_argument("--task", default="addition")
    parser.add_argument("--reward-weights", type=float, nargs="+", default=None)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-group-filter", action="store_true", help="train on every group, even constant ones")
    parser.add_argument("--json", help="write history + summary here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    task = get_task(args.task)
    algorithm = make_algorithm(args.advantage_estimator, task.reward_keys, args.reward_weights)
    result = run_bare_loop(algorithm, task_name=args.task, steps=args.steps, seed=args.seed,
                           filter_groups=not args.no_group_filter)
    print(json.dumps(result["summary"], indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f)
    return result["summary"]


if __name__ == "__main__":
    main()
