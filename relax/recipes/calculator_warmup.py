"""The supervised warm-up of the ``calculator`` task's tiny model, and its shipped checkpoint.

Like the addition warm-up (``relax.recipes.warmup``) it trains on deliberately flawed
demonstrations, so that RL has something to explore from but much to learn. Each demonstration:

- with p = ``tool_share`` calls the calculator: ``<calc>a+b</calc><eos>`` (one operand digit wrong
  with p = 0.2), then the environment's ``<r>sum</r>``, then ``<a>x</a><eos>`` where x is the
  calculator's result with p = ``copy_result`` and a random number otherwise;
- otherwise answers at once with a random number ``<a>x</a><eos>`` (two-digit addition is beyond
  what the model learns here, so a direct answer is almost never right).

Cross-entropy on the model's tokens only (the reply ``<r>…</r>`` is context, as in RL). Recipe:
``RECIPE``. ``python -m relax.recipes.calculator_warmup`` regenerates
``relax/models/tiny/checkpoint/calculator.pt`` (fixed seed, one thread) and prints its base rates.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import torch

from relax.models.tiny.calculator import CHECKPOINT, MODEL_CONFIG, CalculatorTokenizer
from relax.models.tiny.model import TinyCausalLM
from relax.models.tiny.weights import save_tiny_checkpoint
from relax.recipes.supervised import train_supervised
from relax.rollout.base import SamplingParams
from relax.rollout.environments.episodes import EpisodeRunner
from relax.rollout.sampling import sample_groups
from relax.rollout.tasks.calculator import (
    HIGH,
    LOW,
    MAX_NEW_TOKENS,
    REWARD_KEYS,
    CalculatorEnv,
    CalculatorPrompts,
)

RECIPE = {"steps": 1200, "batch_size": 64, "lr": 3e-3, "seed": 0, "tool_share": 0.15, "copy_result": 0.25}
_TOK = CalculatorTokenizer()


def demonstration(rng: random.Random, tool_share: float,
                  copy_result: float = RECIPE["copy_result"]) -> list[tuple[str, bool]]:
    """One episode as ``(text, is_model_turn)`` segments after the prompt (see the module docstring)."""
    a, b = rng.randint(LOW, HIGH), rng.randint(LOW, HIGH)
    segments = [(f"<bos>{a}+{b}=", False)]
    if rng.random() < tool_share:
        x, y = a, b
        if rng.random() < 0.2:  # a slip copying one operand
            x = rng.choice([v for v in range(LOW, HIGH + 1) if v != a])
        result = x + y
        answer = result if rng.random() < copy_result else rng.randint(2 * LOW, 2 * HIGH)
        segments += [(f"<calc>{x}+{y}</calc><eos>", True), (f"<r>{result}</r>", False), (f"<a>{answer}</a><eos>", True)]
    else:
        segments.append((f"<a>{rng.randint(2 * LOW, 2 * HIGH)}</a><eos>", True))
    return segments


def _batch(rng: random.Random, n: int, tool_share: float) -> tuple[torch.Tensor, torch.Tensor]:
    """-> ``(ids [n, L], target_mask [n, L - 1])``: target t + 1 is predicted from column t."""
    rows, masks = [], []
    for _ in range(n):
        ids, loss = [], []
        for text, is_model in demonstration(rng, tool_share):
            tokens = _TOK.encode(text)
            ids += tokens
            loss += [is_model] * len(tokens)
        rows.append(ids)
        masks.append(loss[1:])
    width = max(len(r) for r in rows)
    ids = torch.full((n, width), _TOK.pad_id, dtype=torch.long)
    mask = torch.zeros((n, width - 1), dtype=torch.bool)
    for i, (r, m) in enumerate(zip(rows, masks)):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(m)] = torch.tensor(m)
    return ids, mask


def train_warmup(steps: int = RECIPE["steps"], seed: int = RECIPE["seed"]) -> TinyCausalLM:
    return train_supervised(MODEL_CONFIG, lambda rng: _batch(rng, RECIPE["batch_size"], RECIPE["tool_share"]),
                            steps=steps, lr=RECIPE["lr"], seed=seed)


def measure_base_rates(model: TinyCausalLM, n: int = 256, seed: int = 12345) -> dict[str, float]:
    """``correct`` and the share of episodes that call the calculator, sampled at temperature 1."""
    from relax.rollout.tiny.engine import TinyEngine

    runner = EpisodeRunner(make_env=CalculatorEnv, env_name="calculator", max_turns=4)
    scored = sample_groups(TinyEngine(model, _TOK), CalculatorPrompts(seed).next_batch(n), 1,
                           SamplingParams(max_new_tokens=MAX_NEW_TOKENS), generator=torch.Generator().manual_seed(seed),
                           reward_fn=None, reward_keys=REWARD_KEYS, episodes=runner)
    called = sum(1 for m in scored.metadata if any(i.get("tool_calls") for i in m.get("env_info", [])))
    return {"correct": float(scored.rewards[:, 0].mean()), "tool_call_share": called / n}


def main(argv=None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--out", type=Path, default=CHECKPOINT, help="where to write the checkpoint")
    parser.add_argument("--steps", type=int, default=RECIPE["steps"])
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    start = time.perf_counter()
    model = train_warmup(steps=args.steps)
    seconds = time.perf_counter() - start
    rates = measure_base_rates(model)
    save_tiny_checkpoint(model, args.out, RECIPE, rates)
    print(f"calculator warm-up: {args.steps} steps in {seconds:.1f} s -> {args.out}")
    print("base rates (256 episodes, temperature 1): " + ", ".join(f"{k}={v:.3f}" for k, v in rates.items()))
    return rates


if __name__ == "__main__":
    main()
