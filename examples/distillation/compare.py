"""On-policy distillation and GKD vs GRPO on the built-in addition task: same student, seeds and budget.

The student is the shipped warm-up model (the one a plain ``relax train`` starts from); the teacher is the
same model fine-tuned to solve the task (``relax sft`` on the 80 training problems' answers,
``python -m relax.recipes.addition_teacher``). Each run is a plain ``relax train --in-process`` of the
embedded default with ``--advantage-estimator on-policy-distill`` / ``gkd`` (``--teacher-checkpoint``) or
``grpo``, evaluated greedily on the 20 held-out problems every ``--eval-interval`` steps.

Two reverse KLs to the teacher are reported:

- ``distill/reverse_kl``, what the distillation runs log at every step: the token mean over the step's
  rollout of log pi_student - log pi_teacher at the sampled tokens (a sampled estimate);
- ``exact_reverse_kl``, measured here on every saved checkpoint of every run (GRPO's too): the student
  samples 8 completions of each held-out prompt (temperature 1, the same seed for every checkpoint) and
  the token mean of KL(student || teacher) over the whole 17-token vocabulary is taken at each sampled
  position.

Writes to ``--out`` (default ``examples/distillation/results``): ``summary.json`` (every run's curves and
the first/last-10 % comparisons the docs quote) and ``report.md``.

    python -m relax.recipes.addition_teacher --output-dir /tmp/relax-addition-teacher
    python examples/distillation/compare.py --teacher /tmp/relax-addition-teacher
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
METHODS = ("on-policy-distill", "gkd", "grpo")
TEACHER_METHODS = ("on-policy-distill", "gkd")
WINDOW_FRACTION = 0.1  # "first vs last 10 % of steps"
THRESHOLD = 0.5  # "faster in steps": the first evaluation at or above this held-out accuracy
KL_SAMPLES = 8  # completions per held-out prompt for the exact reverse KL


def run_one(method: str, seed: int, args, out: Path) -> Path:
    """One ``relax train --in-process`` run; returns its output directory."""
    run_dir = out / "runs" / f"{method}-seed{seed}"
    cmd = [sys.executable, "-m", "relax", "train", "--in-process", "--advantage-estimator", method,
           "--num-rollout", str(args.steps), "--eval-interval", str(args.eval_interval),
           "--save-interval", str(args.eval_interval), "--seed", str(seed), "--output-dir", str(run_dir),
           "--overwrite-output-dir", "--no-progress"]
    if method in TEACHER_METHODS:
        cmd += ["--teacher-checkpoint", str(args.teacher)]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    print(f"{method} seed {seed}: {time.perf_counter() - t0:.0f} s", flush=True)
    return run_dir


def read_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def curve(rows: list[dict], key: str) -> dict[int, float]:
    return {row["step"]: row[key] for row in rows if key in row}


def window_means(values: dict[int, float], steps: int) -> tuple[float, float]:
    """Mean over the first and over the last ``WINDOW_FRACTION`` of the steps 0..steps (a step-0 value, the
    evaluation before training, counts in the first window)."""
    width = max(1, round(steps * WINDOW_FRACTION))
    first = [v for s, v in values.items() if s <= width]
    last = [v for s, v in values.items() if s > steps - width]
    return sum(first) / len(first), sum(last) / len(last)


# -- the exact reverse KL of a checkpoint -----------------------------------------------------------


def load_tiny(path: Path):
    """A tiny model from a ``relax sft`` step directory (``model.pt``) or a run checkpoint (``state.pt``)."""
    from relax.models.tiny.weights import load_warmup_model

    if (path / "model.pt").is_file():
        return load_warmup_model(path / "model.pt")
    model = load_warmup_model()
    model.load_state_dict(torch.load(path / "state.pt", map_location="cpu", weights_only=False)
                          ["actor"]["backend"]["model"])
    return model.eval()


def newest_step_dir(path: Path) -> Path:
    steps = sorted(path.glob("checkpoints/step_*"))
    return steps[-1] if steps else path


@torch.no_grad()
def exact_reverse_kl(student, teacher, seed: int = 0, max_new_tokens: int = 8) -> float:
    """Token mean over the student's own samples of KL(student || teacher) over the whole vocabulary."""
    from relax.models.tiny.tokenizer import TinyTokenizer
    from relax.rollout.tasks.addition import held_out_problems

    tok = TinyTokenizer()
    prompts = [tok.encode(p.text) for p in held_out_problems() for _ in range(KL_SAMPLES)]
    ids = torch.tensor(prompts)  # every prompt "<bos>a+b=" has 5 tokens
    alive = torch.ones(len(prompts), dtype=torch.bool)
    g = torch.Generator().manual_seed(seed)
    total, count = 0.0, 0
    for _ in range(max_new_tokens):
        s = torch.log_softmax(student(input_ids=ids).float()[:, -1], -1)
        t = torch.log_softmax(teacher(input_ids=ids).float()[:, -1], -1)
        kl = (s.exp() * (s - t)).sum(-1)
        total += float(kl[alive].sum())
        count += int(alive.sum())
        nxt = torch.multinomial(s.exp(), 1, generator=g)
        ids = torch.cat([ids, nxt], 1)
        alive &= nxt[:, 0] != tok.eos_id
        if not alive.any():
            break
    return total / count


def measure(run_dir: Path, teacher) -> dict[int, float]:
    """``exact_reverse_kl`` of the run's start (the warm-up) and of each saved checkpoint."""
    from relax.models.tiny.weights import load_warmup_model

    kls = {0: exact_reverse_kl(load_warmup_model(), teacher)}
    for step_dir in sorted(run_dir.glob("checkpoints/step_*")):
        kls[int(step_dir.name.split("_")[1])] = exact_reverse_kl(load_tiny(step_dir), teacher)
    return kls


# -- summary ------------------------------------------------------------------------------------------


def summarize(args, out: Path) -> dict:
    teacher = load_tiny(newest_step_dir(args.teacher))
    runs = {}
    for method in args.methods:
        for seed in args.seeds:
            run_dir = out / "runs" / f"{method}-seed{seed}"
            rows = read_rows(run_dir)
            accuracy = curve(rows, "eval/correct/mean")
            entry = {"method": method, "seed": seed, "held_out_accuracy": accuracy,
                     "exact_reverse_kl": measure(run_dir, teacher)}
            entry["accuracy_first_last_10pct"] = list(window_means(accuracy, args.steps))
            entry["accuracy_gain"] = entry["accuracy_first_last_10pct"][1] - entry["accuracy_first_last_10pct"][0]
            entry["steps_to_threshold"] = next((s for s, v in sorted(accuracy.items()) if v >= THRESHOLD), None)
            logged = curve(rows, "distill/reverse_kl")
            if logged:
                first, last = window_means(logged, args.steps)
                entry["distill/reverse_kl"] = logged
                entry["distill/reverse_kl_first_last_10pct"] = [first, last]
                entry["distill/reverse_kl_drop"] = 1.0 - last / first
            runs[f"{method}-seed{seed}"] = entry
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "load_average": " ".join(f"{x:.1f}" for x in os.getloadavg()),
        "steps": args.steps, "eval_interval": args.eval_interval, "seeds": list(args.seeds),
        "window_fraction": WINDOW_FRACTION, "threshold": THRESHOLD,
        "teacher_held_out_accuracy": exact_teacher_accuracy(teacher),
        "runs": runs,
    }


def exact_teacher_accuracy(teacher) -> float:
    """The teacher's greedy held-out accuracy (the ``correct`` reward), measured here."""
    from relax.models.tiny.tokenizer import TinyTokenizer
    from relax.rollout.tasks.addition import held_out_problems

    tok = TinyTokenizer()
    right = 0
    with torch.no_grad():
        for p in held_out_problems():
            ids = torch.tensor([tok.encode(p.text)])
            for _ in range(8):
                nxt = teacher(input_ids=ids)[:, -1].argmax(-1, keepdim=True)
                ids = torch.cat([ids, nxt], 1)
                if int(nxt) == tok.eos_id:
                    break
            first_digits = re.search(r"\d+", tok.decode(ids[0, 5:].tolist()))  # the task's `correct` rule
            right += first_digits is not None and first_digits.group() == str(p.label)
    return right / len(held_out_problems())


def table_row(name: str, run: dict) -> str:
    """One run's row of the table the docs quote (docs/en/distillation.md)."""
    kl = run["exact_reverse_kl"]
    (a0, a1), reached = run["accuracy_first_last_10pct"], run["steps_to_threshold"]
    logged = run.get("distill/reverse_kl_first_last_10pct")
    logged_text = (f"{logged[0]:.3f} → {logged[1]:.3f} (−{100 * run['distill/reverse_kl_drop']:.0f} %)"
                   if logged else "—")
    return (f"| {name} | {a0:.3f} → {a1:.3f} (+{run['accuracy_gain']:.3f}) | {reached if reached is not None else '—'} | "
            f"{kl[min(kl, key=int)]:.3f} → {kl[max(kl, key=int)]:.3f} | {logged_text} |")


def report(summary: dict) -> str:
    steps = summary["steps"]
    setting = (f"{steps} steps per run, seeds {summary['seeds']}, {summary['machine']}, load average "
               f"{summary['load_average']}; the teacher's held-out accuracy: {summary['teacher_held_out_accuracy']:.2f}.")
    header = (f"| run | held-out accuracy, first → last 10 % of steps | first eval step ≥ {summary['threshold']} | "
              f"exact reverse KL to the teacher, step 0 → {steps} | `distill/reverse_kl`, first → last 10 % of steps |")
    lines = [f"# On-policy distillation, GKD and GRPO on the addition task ({summary['date']})", "", setting, "",
             header, "|---|---|---|---|---|"]
    lines += [table_row(name, run) for name, run in summary["runs"].items()]
    lines += ["", "Held-out accuracy at every evaluation (step: accuracy):", ""]
    for name, run in summary["runs"].items():
        curve_text = ", ".join(f"{s}: {v:.2f}" for s, v in sorted(run["held_out_accuracy"].items(), key=lambda x: int(x[0])))
        lines.append(f"- {name}: {curve_text}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--teacher", type=Path, required=True, help="the teacher's relax sft output directory")
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--eval-interval", type=int, default=5)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1234, 1])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--rebuild", action="store_true", help="summarize the runs already in --out")
    args = parser.parse_args(argv)
    args.teacher = args.teacher.resolve()
    if not args.rebuild:
        for method in args.methods:
            for seed in args.seeds:
                run_one(method, seed, args, args.out)
    summary = summarize(args, args.out)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (args.out / "report.md").write_text(report(summary), encoding="utf-8")
    print(report(summary))


if __name__ == "__main__":
    main()
