"""The supervised warm-up that makes the embedded default learnable, and the shipped checkpoint.

Why: from random init, RL on the addition task learns format and length but correctness collapses
onto the best constant answer. A short supervised phase on *deliberately flawed* demonstrations
puts every reward component mid-range, so RL has something to explore from (see
``docs/en/embedded-default.md``).

Each demonstration independently: has the right answer or a wrong one (p = 0.5 each); has intact
tags ``<a>…</a>`` or broken ones (p = 0.5: opening tag dropped, closing tag dropped, both dropped,
or the two swapped); stops with ``<eos>`` or never stops (p = 0.5: filled with random
non-special tokens up to 8). Recipe: 400 steps, batch 64, AdamW lr 3e-3, cross-entropy on the
response tokens only.

``python -m relax.recipes.warmup --out relax/models/tiny/checkpoint/warmup.pt`` regenerates
the shipped checkpoint (deterministic: fixed seed, one thread) and prints its base rates;
``relax.models.tiny.weights.load_warmup_model()`` loads the shipped one.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import torch

from relax.models.tiny.model import TinyCausalLM, TinyLMConfig
from relax.models.tiny.tokenizer import DIGITS, TinyTokenizer
from relax.models.tiny.weights import CHECKPOINT, save_tiny_checkpoint
from relax.recipes.supervised import train_supervised
from relax.rollout.base import SamplingParams
from relax.rollout.tasks.addition import (
    BASE_COMPONENTS,
    MAX_NEW_TOKENS,
    AdditionPrompts,
    prompt_text,
    score_components,
)
from relax.rollout.tiny.engine import TinyEngine

RECIPE = {"steps": 400, "batch_size": 64, "lr": 3e-3, "seed": 0}
_TOK = TinyTokenizer()
_FILLER = [*DIGITS, "+", "=", "<a>", "</a>"]


def flawed_demonstration(rng: random.Random) -> tuple[str, str]:
    """One (prompt, completion) pair with independent flaws (see the module docstring)."""
    a, b = rng.randint(0, 9), rng.randint(0, 9)
    answer = a + b if rng.random() < 0.5 else rng.choice([v for v in range(19) if v != a + b])
    tokens = ["<a>", *str(answer), "</a>"]
    if rng.random() < 0.5:
        broken = rng.choice(("no_open", "no_close", "none", "swapped"))
        if broken == "no_open":
            tokens = tokens[1:]
        elif broken == "no_close":
            tokens = tokens[:-1]
        elif broken == "none":
            tokens = tokens[1:-1]
        else:
            tokens = ["</a>", *tokens[1:-1], "<a>"]
    if rng.random() < 0.5:
        tokens.append("<eos>")
    else:
        tokens += [rng.choice(_FILLER) for _ in range(MAX_NEW_TOKENS - len(tokens))]
    return prompt_text(a, b), "".join(tokens)


def _demo_batch(rng: random.Random, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """-> ``(input_ids [n, 5 + 8], loss_mask [n, 12])``; the mask marks targets that are responses."""
    rows, masks = [], []
    for _ in range(n):
        prompt, completion = flawed_demonstration(rng)
        p, c = _TOK.encode(prompt), _TOK.encode(completion)
        pad = MAX_NEW_TOKENS - len(c)
        rows.append(p + c + [_TOK.pad_id] * pad)
        # target t+1 is predicted from column t; only response tokens are targets.
        masks.append([False] * (len(p) - 1) + [True] * len(c) + [False] * pad)
    return torch.tensor(rows), torch.tensor(masks)


def train_warmup(
    steps: int = RECIPE["steps"], batch_size: int = RECIPE["batch_size"], lr: float = RECIPE["lr"], seed: int = RECIPE["seed"]
) -> TinyCausalLM:
    # no padding inside the prompt: every prompt has 5 tokens
    return train_supervised(TinyLMConfig(), lambda rng: _demo_batch(rng, batch_size), steps=steps, lr=lr, seed=seed)


def measure_base_rates(model: TinyCausalLM, n: int = 512, seed: int = 12345, temperature: float = 1.0) -> dict[str, float]:
    """Mean of every reward component over ``n`` completions sampled at ``temperature``."""
    engine = TinyEngine(model)
    prompts = AdditionPrompts(seed).next_batch(n)
    gen = engine.generate(
        [_TOK.encode(p.text) for p in prompts],
        SamplingParams(temperature=temperature, max_new_tokens=MAX_NEW_TOKENS),
        torch.Generator().manual_seed(seed),
    )
    totals = dict.fromkeys(BASE_COMPONENTS, 0.0)
    for p, completion in zip(prompts, engine.decode_responses(gen)):
        for k, v in score_components(p.text, completion, p.label, p.metadata).items():
            totals[k] += v
    return {k: v / n for k, v in totals.items()}


def main(argv=None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--out", type=Path, default=CHECKPOINT, help="where to write the checkpoint")
    parser.add_argument("--seed", type=int, default=RECIPE["seed"])
    parser.add_argument("--steps", type=int, default=RECIPE["steps"])
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # determinism across machines and no contention on shared CPUs
    start = time.perf_counter()
    model = train_warmup(steps=args.steps, seed=args.seed)
    seconds = time.perf_counter() - start
    rates = measure_base_rates(model)
    save_tiny_checkpoint(model, args.out, RECIPE, rates)
    print(f"warm-up: {args.steps} steps in {seconds:.1f} s -> {args.out} ({args.out.stat().st_size / 1024:.0f} KiB)")
    print("base rates (512 samples, temperature 1): " + ", ".join(f"{k}={v:.3f}" for k, v in rates.items()))
    return rates


if __name__ == "__main__":
    main()
