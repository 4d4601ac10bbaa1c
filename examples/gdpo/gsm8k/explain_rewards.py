"""What GRPO and GDPO do with this recipe's rewards, without a model.

For every problem of the bundled file, a group of scripted completions (correct and well formed,
correct without the ``<think>`` block, wrong number, ``17.0`` instead of ``17``, a unit after the
number, no tags, ...) is scored with ``reward.py``; the ``[N, 3]`` reward matrix then goes through
GRPO's and GDPO's real ``normalize_rewards`` / ``group_has_signal`` / ``compute_advantages`` and
through ``relax.algorithms.diagnostics``. The output shows the mean advantage each kind of completion
gets under both methods, and the per-step diagnostics the runtime logs.

    python -m examples.gdpo.gsm8k.explain_rewards [--weights 1 1 1] [--group-size 6] [--seed 0]

(run from the repository root). No training happens here; ``run_cpu.sh`` runs the training path.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch

from examples.gdpo.gsm8k.reward import REWARD_KEYS, label_number, reward
from relax.algorithms import AdvantageInputs, AlgorithmConfig, load_algorithm
from relax.algorithms.diagnostics import reward_diagnostics

DATA = Path(__file__).parent / "data" / "gsm8k_mini.jsonl"


def completion_kinds(answer: str) -> dict[str, str]:
    """Scripted completions for one problem, by kind. ``answer`` is the label's final number."""
    number = int(label_number(answer))
    wrong = number + 1
    return {
        "correct, formatted": f"<think>I work it out.</think><answer>{number:,}</answer>",
        "correct, no think": f"<answer>{number}</answer>",
        "correct as decimal": f"<think>I work it out.</think><answer>{number}.0</answer>",
        "wrong, formatted": f"<think>I guess.</think><answer>{wrong}</answer>",
        "wrong, no think": f"<answer>{wrong}</answer>",
        "number with unit": f"<think>I work it out.</think><answer>{number} items</answer>",
        "no tags": f"The answer is {number}.",
    }


def build_batch(rows, group_size: int, seed: int):
    rng = random.Random(seed)
    rewards, group_ids, kinds = [], [], []
    for g, row in enumerate(rows):
        options = completion_kinds(row["answer"])
        for kind in rng.choices(list(options), k=group_size):
            scores = reward(row["question"], options[kind], row["answer"], {})
            rewards.append([scores[k] for k in REWARD_KEYS])
            group_ids.append(g)
            kinds.append(kind)
    return torch.tensor(rewards, dtype=torch.float64), torch.tensor(group_ids), kinds


def per_sample_advantages(name: str, config: AlgorithmConfig, rewards, group_ids) -> torch.Tensor:
    """The algorithm's advantages for the kept groups, 0 for the groups its rollout would drop."""
    algo = load_algorithm(name)(config)
    keep = algo.group_has_signal(rewards, group_ids)
    normalized = algo.normalize_rewards(rewards[keep], group_ids[keep])
    mask = torch.ones(int(keep.sum()), 1, dtype=torch.bool)
    advantages, _ = algo.compute_advantages(AdvantageInputs(rewards=normalized, response_mask=mask))
    out = torch.zeros(len(rewards))
    out[keep] = advantages[:, 0]
    return out


def main(argv=None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--weights", type=float, nargs=3, default=[1.0, 1.0, 1.0], metavar="W",
                        help="reward weights for correctness, format, integer")
    parser.add_argument("--group-size", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    rows = [json.loads(line) for line in DATA.read_text().splitlines()]
    rewards, group_ids, kinds = build_batch(rows, args.group_size, args.seed)
    config = AlgorithmConfig(
        n_samples_per_prompt=args.group_size, reward_keys=REWARD_KEYS, reward_weights=tuple(args.weights)
    )
    adv = {name: per_sample_advantages(name, config, rewards, group_ids) for name in ("grpo", "gdpo")}

    print(f"{len(rows)} groups x {args.group_size} scripted completions, weights {tuple(args.weights)}\n")
    print(f"| completion | {' | '.join(REWARD_KEYS)} | count | GRPO mean adv | GDPO mean adv |")
    print("|---|" + "---:|" * (len(REWARD_KEYS) + 3))
    for kind in completion_kinds("#### 1"):
        idx = torch.tensor([i for i, k in enumerate(kinds) if k == kind], dtype=torch.long)
        if len(idx) == 0:
            continue
        cells = " | ".join(f"{v:g}" for v in rewards[idx[0]].tolist())
        print(f"| {kind} | {cells} | {len(idx)} | {adv['grpo'][idx].mean():+.3f} | {adv['gdpo'][idx].mean():+.3f} |")

    metrics = reward_diagnostics(rewards, group_ids, REWARD_KEYS, args.weights, adv["gdpo"])
    print("\nGDPO step diagnostics (relax.algorithms.diagnostics.reward_diagnostics):")
    for name, value in metrics.items():
        print(f"  {name:36s} {value:.4f}")
    return metrics


if __name__ == "__main__":
    main()
