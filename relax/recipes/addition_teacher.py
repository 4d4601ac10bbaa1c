"""A teacher for the embedded default, made by ``relax sft`` in well under a minute on a CPU.

    python -m relax.recipes.addition_teacher --output-dir outputs/addition-teacher

writes ``<output-dir>/demos.jsonl`` — the 80 training problems of the built-in addition task with
their correct, well-formed answers (``{"prompt": "<bos>3+4=", "completion": "<a>7</a>"}``; the 20
held-out problems are never among them) — and runs ``relax sft`` on it from the built-in warm-up
model (the model ``relax train`` starts from), with the flags of ``RECIPE_FLAGS``. The result is
``<output-dir>/checkpoints/step_000<steps>/``, where ``TEACHER_STEPS`` is the recipe's step count
(``model.pt`` for the built-in model, ``state.pt`` a relax checkpoint); ``relax train --load`` of the
output directory starts RL from it. Its held-out accuracy is measured by ``relax sft``'s evaluation
(``relax train``'s, greedy, on the 20 held-out problems) and printed at the end.

The recipe runs ``relax sft`` as a command (the CLI sits beside the recipes, not below them).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from relax.rollout.tasks.addition import all_problems, held_out_problems

DEMOS_NAME = "demos.jsonl"
BATCH_SIZE, EPOCHS = 8, 30
RECIPE_FLAGS = ("--lr", "1e-3", "--lr-decay-style", "cosine", "--batch-size", str(BATCH_SIZE),
                "--num-epochs", str(EPOCHS), "--eval-interval", "50")


def training_demonstrations() -> list[dict]:
    """The correct, well-formed answer of every training problem (the held-out ones excluded)."""
    held_out = {p.text for p in held_out_problems()}
    return [{"prompt": p.text, "completion": f"<a>{p.label}</a>"} for p in all_problems() if p.text not in held_out]


def teacher_steps() -> int:
    return EPOCHS * -(-len(training_demonstrations()) // BATCH_SIZE)


def write_demonstrations(path: Path) -> int:
    rows = training_demonstrations()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return len(rows)


def sft_arguments(out: Path, *extra: str) -> list[str]:
    return ["sft", "--data", str(out / DEMOS_NAME), "--output-dir", str(out), *RECIPE_FLAGS, *extra]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--output-dir", type=Path, default=Path("outputs/addition-teacher"))
    args, extra = parser.parse_known_args(argv)  # the rest go to relax sft (e.g. --seed 3, --no-progress)
    write_demonstrations(args.output_dir / DEMOS_NAME)
    command = [sys.executable, "-m", "relax", *sft_arguments(args.output_dir, *extra)]
    code = subprocess.run(command, check=False).returncode  # relax sft printed its own error
    if code == 0:
        print(f"teacher: {args.output_dir / 'checkpoints' / f'step_{teacher_steps():06d}'}")
    return code


if __name__ == "__main__":
    sys.exit(main())
