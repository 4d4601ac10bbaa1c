"""GRPO vs GDPO on the built-in addition task: same seeds, same budget, several reward settings.

Each run trains the shipped warm-up model with ``relax train --in-process``
(``relax.recipes.single_process``: one process, one thread, 32 prompts x 8 samples, two mini-batches
per rollout) and logs every reward component and the multi-reward diagnostics at every step. Settings (``docs/en/embedded-default.md``):

- A: the four components correct, digits, format, length, weight 1 each (balanced);
- B: the same with ``length`` x10 (optional: not in the default run);
- C: plus ``brevity`` (1 - len/8 if the answer stops) x10, which conflicts with two-digit answers;
- D: plus a reproducible coin-flip ``judge`` x5 that carries no information.

"x10" multiplies the component's raw value (a ``--custom-rm-path`` function of ``scaled_rewards.py``),
as if the reward function reported it on a 0..10 scale; every reward weight stays 1. That is the scale GDPO is
invariant to. A reward *weight* of 10 is a different thing: GDPO applies weights after its
per-component normalization, so weight 10 really makes the component dominate for GDPO too.

Writes to ``--out`` (default ``examples/gdpo/results``): ``compare.png`` (each component over steps,
GRPO vs GDPO, mean over seeds with the min-max band), ``report.md`` (the numbers and what they show,
the prose generated from the numbers), ``summary.json`` (the aggregated table) and ``runs.json``
(every run's per-step metrics, from which the table is computed).

    python examples/gdpo/compare.py                    # A, C, D x 3 seeds x 450 steps
    python examples/gdpo/compare.py --settings A B C D --seeds 5 --steps 600
    python examples/gdpo/compare.py --quick --out /tmp/gdpo_quick   # smoke test, well under a minute

Runs go one after the other by default: on 2 cores two worker processes measured *slower* than
one (see the README); ``--workers 2`` is there for bigger machines.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import attrs

HERE = Path(__file__).resolve().parent
METHODS = ("grpo", "gdpo")
BASE = ("correct", "digits", "format", "length")
WINDOW_FRACTION = 0.1  # "last 10 % of steps"
TRAILING = 20  # steps in the trailing mean that dates a collapse
HACKED_CORRECT = 0.05  # correct at or below this = the policy gave up on the answer
PROMPTS, SAMPLES, MINIBATCHES = 32, 8, 2  # each step: 32 prompts x 8 samples, two optimizer steps


@attrs.frozen
class Setting:
    name: str
    task: str
    # Factor on each component's raw value (the reward function reporting it on a bigger scale);
    # the reward weights stay 1. A GDPO *weight* of 10 would be applied after the per-component
    # normalization and really make the component 10x as important, for both methods.
    scales: tuple[float, ...]
    description: str

    @property
    def components(self) -> tuple[str, ...]:
        from relax.rollout.tasks import get_task

        return get_task(self.task).reward_keys

    @property
    def reward(self) -> str | None:
        """The ``--custom-rm-path`` of ``scaled_rewards`` that reports the scaled component (None: the
        task's own reward)."""
        key = self.scaled
        return None if key is None else f"scaled_rewards:{key}_x{dict(zip(self.components, self.scales))[key]:g}"

    @property
    def scaled(self) -> str | None:
        """The component whose scale is not 1 (None for a balanced setting)."""
        odd = [k for k, f in zip(self.components, self.scales) if f != 1.0]
        return odd[0] if odd else None


SETTINGS = {
    "A": Setting(
        "A", "addition", (1, 1, 1, 1), "four components in [0, 1], all on the same scale (balanced)"
    ),
    "B": Setting("B", "addition", (1, 1, 1, 10), "the four components with `length` reported x10"),
    "C": Setting(
        "C",
        "addition-brevity",
        (1, 1, 1, 1, 10),
        "plus `brevity` (1 - len/8 if it stops) reported x10, which conflicts with two-digit answers",
    ),
    "D": Setting(
        "D", "addition-judge", (1, 1, 1, 1, 5), "plus a coin-flip `judge` reported x5 that carries no signal"
    ),
}

# What the prototype in docs/en/embedded-default.md measured (3 seeds, last 100 of 600 steps); the report
# checks each setting's numbers against these qualitative expectations.
NOTE_EXPECTS = {
    "A": "no difference beyond seed noise (correct 0.967 GRPO vs 0.960 GDPO)",
    "B": "the same as A for both methods",
    "C": "GRPO collapses to empty answers in ~100-150 steps in 3/3 seeds (correct 0.00) while GDPO still "
    "learns (correct 0.945)",
    "D": "GRPO held back (correct 0.64, greedy 0.75) while GDPO learns (correct 0.94, greedy 0.99)",
}

QUICK_NOTE = (
    "\n*This is the `--quick` smoke configuration: far too few steps for any method to learn, so the "
    "comparisons below say nothing about GRPO or GDPO.*\n"
)
DEFAULTS = {"settings": ("A", "C", "D"), "seeds": 3, "steps": 450}
QUICK = {"settings": ("A", "C", "D"), "seeds": 2, "steps": 12}


# -- running ---------------------------------------------------------------------------------------


def run_one(job: dict) -> dict:
    """Train one (setting, method, seed) with ``relax train --in-process`` and return its per-step metrics
    (runs in a worker too)."""
    import tempfile

    from relax.config.algorithm import AlgorithmConfig
    from relax.config.run import RunConfig
    from relax.recipes.single_process import train_single_process

    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))  # scaled_rewards, the settings' --custom-rm-path functions
    setting = SETTINGS[job["setting"]]
    # the embedded-default recipe (docs/en/embedded-default.md), every reward weight 1
    algorithm = AlgorithmConfig(n_samples_per_prompt=SAMPLES, reward_keys=setting.components, eps_clip=0.2,
                                eps_clip_high=0.28, loss_aggregation="token_mean")
    with tempfile.TemporaryDirectory(prefix="gdpo_compare_") as out:
        config = RunConfig(
            advantage_estimator=job["method"], algorithm=algorithm, task=setting.task, custom_rm_path=setting.reward,
            rollout_batch_size=PROMPTS, num_steps_per_rollout=MINIBATCHES, num_rollout=job["steps"],
            seed=job["seed"], evaluate=False, progress=False, log_interval=job["steps"], output_dir=out,
        )
        result = train_single_process(config)
    keep = (
        "step",
        "rollout/groups_kept",
        "rollout/response_len",
        "multi_reward/collapse_rate",
        "multi_reward/gdpo_cancel_rate",
        "multi_reward/varied_group_frac",
    )
    factors = dict(zip(setting.components, setting.scales))
    history = [
        # reward/<key>/mean in the task's units: the scaled component's mean divided by its factor
        {k: v / factors[k.split("/")[1]] if k.startswith("reward/") else v for k, v in row.items()
         if k in keep or (k.startswith("reward/") and k.endswith("/mean") and k.split("/")[1] in factors)}
        for row in result.rows if "time/step_s" in row
    ]
    return {
        **job,
        "task": setting.task,
        "scales": list(setting.scales),
        "components": list(setting.components),
        "greedy_accuracy": final_greedy_accuracy(result.weights, setting.task),
        "seconds": result.seconds,
        "history": history,
    }


def final_greedy_accuracy(weights: dict, task_name: str) -> float:
    """The fraction of the 100 addition problems the trained policy answers correctly at temperature 0."""
    from relax.models.tiny.weights import load_warmup_model
    from relax.rollout.tasks import get_task
    from relax.rollout.tasks.addition import greedy_accuracy
    from relax.rollout.tiny.engine import TinyEngine

    task = get_task(task_name)
    engine = TinyEngine(load_warmup_model(), task.make_tokenizer())
    engine.load_weights(weights)
    return greedy_accuracy(engine, task)


def run_all(jobs: list[dict], workers: int) -> list[dict]:
    start = time.perf_counter()
    done: list[dict] = []

    def progress(run: dict) -> None:
        done.append(run)
        s = run_summary(run)
        elapsed = time.perf_counter() - start
        eta = elapsed / len(done) * (len(jobs) - len(done))
        print(
            f"[{len(done):2d}/{len(jobs)}] {run['setting']} {run['method']:4s} seed {run['seed']}: "
            f"correct(last 10%)={s['last']['correct']:.3f} greedy={run['greedy_accuracy']:.2f} "
            f"{run['seconds']:.0f} s  (elapsed {elapsed / 60:.1f} min, ~{eta / 60:.1f} min left)",
            flush=True,
        )

    if workers <= 1:
        for job in jobs:
            progress(run_one(job))
        return done
    # spawn: a fresh interpreter per worker (no forked torch thread pools); one thread each.
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        for run in pool.map(run_one, jobs):
            progress(run)
    return done


# -- aggregation -----------------------------------------------------------------------------------


def window(n_steps: int) -> int:
    return max(1, math.ceil(WINDOW_FRACTION * n_steps))


def _mean(values):
    values = list(values)
    return sum(values) / len(values)


def run_summary(run: dict) -> dict:
    """One run's numbers: each component over the first/last 10 % of steps, collapse rate (mean over
    all steps), response length, greedy accuracy, and the step at which ``correct`` collapsed."""
    hist = run["history"]
    w = window(len(hist))
    comp = run["components"]
    first = {k: _mean(r[f"reward/{k}/mean"] for r in hist[:w]) for k in comp}
    last = {k: _mean(r[f"reward/{k}/mean"] for r in hist[-w:]) for k in comp}
    correct = [r["reward/correct/mean"] for r in hist]
    trailing = [_mean(correct[max(0, i - TRAILING + 1) : i + 1]) for i in range(len(correct))]
    collapse_step = next(
        (hist[i]["step"] for i in range(TRAILING - 1, len(hist)) if trailing[i] <= HACKED_CORRECT), None
    )
    return {
        "first": first,
        "last": last,
        "collapse_rate": _mean(r["multi_reward/collapse_rate"] for r in hist),
        "gdpo_cancel_rate": _mean(r["multi_reward/gdpo_cancel_rate"] for r in hist),
        "tokens_last": _mean(r["rollout/response_len"] for r in hist[-w:]),
        "greedy_accuracy": run["greedy_accuracy"],
        "correct_collapse_step": collapse_step,
    }


def mean_std(values) -> tuple[float, float]:
    """Mean and sample std (ddof 1; 0 for a single seed) over seeds."""
    values = [float(v) for v in values]
    return _mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def aggregate(runs: list[dict]) -> dict:
    """``{setting: {method: {...}}}``: per metric ``[mean, std]`` over seeds, plus the per-seed runs."""
    table: dict = {}
    for name in dict.fromkeys(r["setting"] for r in runs):
        table[name] = {}
        for method in METHODS:
            mine = sorted(
                (r for r in runs if r["setting"] == name and r["method"] == method), key=lambda r: r["seed"]
            )
            if not mine:
                continue
            sums = [run_summary(r) for r in mine]
            comp = mine[0]["components"]
            table[name][method] = {
                "seeds": [r["seed"] for r in mine],
                "steps": len(mine[0]["history"]),
                "components": comp,
                "scales": mine[0]["scales"],
                "last": {k: mean_std(s["last"][k] for s in sums) for k in comp},
                "first": {k: mean_std(s["first"][k] for s in sums) for k in comp},
                "greedy_accuracy": mean_std(s["greedy_accuracy"] for s in sums),
                "collapse_rate": mean_std(s["collapse_rate"] for s in sums),
                "gdpo_cancel_rate": mean_std(s["gdpo_cancel_rate"] for s in sums),
                "tokens_last": mean_std(s["tokens_last"] for s in sums),
                "per_seed_correct_last": [s["last"]["correct"] for s in sums],
                "correct_collapse_steps": [s["correct_collapse_step"] for s in sums],
            }
    return table


# -- plot ------------------------------------------------------------------------------------------


def _smooth(values: list[float], k: int) -> list[float]:
    return [_mean(values[max(0, i - k + 1) : i + 1]) for i in range(len(values))]


def plot(runs: list[dict], path: Path, smooth: int = 10) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = list(dict.fromkeys(r["setting"] for r in runs))
    n_cols = max(len(r["components"]) for r in runs) + 1  # + response length
    fig, axes = plt.subplots(
        len(settings), n_cols, figsize=(3.0 * n_cols, 2.5 * len(settings)), squeeze=False, sharex=True
    )
    colors = {"grpo": "tab:red", "gdpo": "tab:blue"}
    for row, name in enumerate(settings):
        comp = next(r["components"] for r in runs if r["setting"] == name)
        scales = next(r["scales"] for r in runs if r["setting"] == name)
        panels = [
            (f"reward/{k}/mean", f"{k}" + (f" (x{f:g})" if f != 1 else "")) for k, f in zip(comp, scales)
        ]
        panels += [(None, None)] * (n_cols - 1 - len(panels)) + [("rollout/response_len", "response tokens")]
        for col, (key, title) in enumerate(panels):
            ax = axes[row][col]
            if key is None:
                ax.axis("off")
                continue
            for method in METHODS:
                mine = [r for r in runs if r["setting"] == name and r["method"] == method]
                if not mine:
                    continue
                curves = [_smooth([h[key] for h in r["history"]], smooth) for r in mine]
                steps = [h["step"] for h in mine[0]["history"]]
                mean = [_mean(c[i] for c in curves) for i in range(len(steps))]
                ax.plot(
                    steps, mean, color=colors[method], label=f"{method.upper()} ({len(mine)} seeds)", lw=1.3
                )
                ax.fill_between(
                    steps,
                    [min(c[i] for c in curves) for i in range(len(steps))],
                    [max(c[i] for c in curves) for i in range(len(steps))],
                    color=colors[method],
                    alpha=0.18,
                    lw=0,
                )
            ax.set_title(f"{name}: {title}", fontsize=9)
            if key.startswith("reward/"):
                ax.set_ylim(-0.03, 1.03)
            ax.tick_params(labelsize=7)
            if row == len(settings) - 1:
                ax.set_xlabel("step", fontsize=8)
        axes[row][0].legend(fontsize=7, loc="lower right")
    fig.suptitle(
        f"GRPO vs GDPO on the addition task: per-step means ({smooth}-step moving average), "
        "line = mean over seeds, band = min-max over seeds",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- report ----------------------------------------------------------------------------------------


def fmt(pair) -> str:
    return f"{pair[0]:.3f} ± {pair[1]:.3f}"


def report_table(table: dict) -> str:
    extras = [k for s in table.values() for m in s.values() for k in m["components"] if k not in BASE]
    extras = list(dict.fromkeys(extras))
    head = ["setting", "method", *BASE, *extras, "greedy acc (100)", "collapse rate"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 2 + "---:|" * (len(head) - 2)]
    for name, methods in table.items():
        for method, m in methods.items():
            cells = [name, method.upper()]
            cells += [fmt(m["last"][k]) if k in m["last"] else "—" for k in (*BASE, *extras)]
            cells += [fmt(m["greedy_accuracy"]), fmt(m["collapse_rate"])]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _clear_gap(a, b, n: int) -> bool:
    """True when the means differ by more than seed noise: |diff| > max(0.05, 2 standard errors)."""
    se = math.sqrt((a[1] ** 2 + b[1] ** 2) / max(1, n))
    return abs(a[0] - b[0]) > max(0.05, 2 * se)


def _hacked(m: dict) -> list[bool]:
    """Per seed: correct at most 0.05 over the last 10 % of steps (the policy gave up on the answer;
    the warm-up model starts near 0.13)."""
    return [c <= HACKED_CORRECT for c in m["per_seed_correct_last"]]


def findings(table: dict) -> tuple[list[str], dict[str, bool]]:
    """Sentences about each setting, generated from the numbers, and whether each matches the note."""
    lines: list[str] = []
    matches: dict[str, bool] = {}
    for name, methods in table.items():
        if set(methods) != set(METHODS):
            continue
        g, d = methods["grpo"], methods["gdpo"]
        n = len(g["seeds"])
        gc, dc = g["last"]["correct"], d["last"]["correct"]
        gap = _clear_gap(gc, dc, n)
        setting = SETTINGS[name]
        head = f"**{name}** ({setting.description}): "
        text = (
            f"correct over the last 10% of steps is {gc[0]:.3f} (GRPO) vs {dc[0]:.3f} (GDPO), "
            f"{'a clear difference' if gap else 'no difference beyond seed noise'} "
            f"(Δ = {dc[0] - gc[0]:+.3f}); greedy accuracy {g['greedy_accuracy'][0]:.2f} vs "
            f"{d['greedy_accuracy'][0]:.2f}."
        )
        if setting.scaled is None or name == "B":
            ok = not gap
        else:
            extra = setting.scaled
            hacked_g, hacked_d = _hacked(g), _hacked(d)
            steps = [s for s, h in zip(g["correct_collapse_steps"], hacked_g) if h and s is not None]
            text += (
                f" GRPO's `{extra}` ended at {g['last'][extra][0]:.3f} and its answers at "
                f"{g['tokens_last'][0]:.2f} tokens (GDPO: {d['last'][extra][0]:.3f}, {d['tokens_last'][0]:.2f} tokens)."
            )
            if any(hacked_g):
                text += (
                    f" GRPO's correct fell to {gc[0]:.3f} and it gave up on the answer in {sum(hacked_g)}/{n} "
                    f"seeds"
                    + (
                        f" (trailing-{TRAILING} correct ≤ {HACKED_CORRECT} from step {min(steps)}–{max(steps)})"
                        if steps
                        else ""
                    )
                    + "."
                )
            if steps and (max(steps) < 100 or min(steps) > 150):
                when = "earlier" if max(steps) < 100 else "later"
                text += f" That is {when} than the ~100-150 steps the note saw."
            if "A" in table and "gdpo" in table["A"]:
                text += (
                    f" GDPO's correct here ({dc[0]:.3f}) is {abs(dc[0] - table['A']['gdpo']['last']['correct'][0]):.3f}"
                    f" away from its correct with balanced rewards in A ({table['A']['gdpo']['last']['correct'][0]:.3f})."
                )
            if any(hacked_d):
                text += f" GDPO gave up on the answer in {sum(hacked_d)}/{n} seeds too."
            learned_d = dc[0] - d["first"]["correct"][0]
            text += f" GDPO's correct moved {learned_d:+.3f} from the first 10% of steps."
            if name == "C":
                ok = all(hacked_g) and not any(hacked_d) and learned_d > 0.1
            else:  # D
                ok = gap and dc[0] > gc[0]
        text += (
            f" The collapse rate (groups GRPO cannot use but GDPO can) averaged {g['collapse_rate'][0]:.3f} "
            f"in GRPO's runs and {d['collapse_rate'][0]:.3f} in GDPO's."
        )
        expectation = NOTE_EXPECTS[name]
        text += (
            f" This matches the note's measurement ({expectation})."
            if ok
            else f" **This contradicts the note's expectation** ({expectation})."
        )
        matches[name] = ok
        lines.append(head + text)
    return lines, matches


def conclusion(table: dict, matches: dict[str, bool]) -> str:
    balanced = [s for s in ("A", "B") if s in matches]
    scaled = [s for s in ("C", "D") if s in matches]
    if not balanced or not scaled:
        return (
            "This run does not include both a balanced and a scaled setting, so it cannot say where GDPO's "
            "gain comes from."
        )
    no_gain_balanced = all(matches[s] for s in balanced)
    wins = [s for s in scaled if matches[s]]
    if no_gain_balanced and len(wins) == len(scaled):
        return (
            "GDPO's win is scale invariance, not a gain on balanced rewards: with balanced components "
            f"({', '.join(balanced)}) the two methods end at the same correctness within seed noise, and only "
            f"when one component's scale dwarfs the others ({', '.join(scaled)}) does GRPO, which normalizes "
            "the weighted sum, let that component take over while GDPO, which normalizes each component "
            "within its group first, keeps learning the answer."
        )
    parts = []
    if not no_gain_balanced:
        parts.append(
            f"on balanced rewards ({', '.join(s for s in balanced if not matches[s])}) the methods "
            "differed beyond seed noise, unlike the note"
        )
    missing = [s for s in scaled if not matches[s]]
    if missing:
        parts.append(f"in {', '.join(missing)} GDPO's advantage over GRPO was not what the note measured")
    return (
        "The numbers do not fully show the expected picture (GDPO's win being scale invariance): "
        + "; ".join(parts)
        + ". See the table; more seeds or steps may be needed."
    )


def budget_note(steps: int) -> str:
    if steps >= 600:
        return ""
    return (
        f"\nThe note trained 600 steps per run; this run trained {steps}, so absolute correctness is lower "
        "than the note's (it saw correct ≥ 0.9 only from step 470-550): compare the methods with each other, "
        "at equal budget, not with the note's absolute numbers.\n"
    )


def collapse_note(table: dict) -> str:
    """What the collapse rate says on this run (generated from its largest value)."""
    rates = [m["collapse_rate"][0] for methods in table.values() for m in methods.values()]
    top = max(rates)
    if top < 0.01:
        return (
            f"The collapse rate stayed at or below {top:.4f} in every setting: with 8 samples per group, "
            "groups whose reward tuples differ but whose weighted sums are all exactly equal are rare on this "
            "task. So where GRPO falls behind here, the signal was not thrown away but drowned: the large-scale "
            "component dominates the weighted sum that GRPO normalizes."
        )
    return (
        f"The collapse rate reached {top:.3f} (mean over steps): that fraction of groups gave GRPO no signal "
        "at all while GDPO still learned from them."
    )


def write_report(table: dict, path: Path, *, wall_s: float, load: float | None, args, png_name: str) -> None:
    lines_f, matches = findings(table)
    any_setting = next(iter(table.values()))
    steps = next(iter(any_setting.values()))["steps"]
    seeds = next(iter(any_setting.values()))["seeds"]
    cmd = (
        "python examples/gdpo/compare.py"
        + (" --quick" if args.quick else "")
        + (
            f" --settings {' '.join(args.settings)} --seeds {args.seeds} --steps {args.steps}"
            if not args.quick
            else ""
        )
    )
    settings_lines = [
        f"- **{n}**: task `{SETTINGS[n].task}`, component scales "
        f"{dict(zip(SETTINGS[n].components, (float(f) for f in SETTINGS[n].scales)))} — "
        f"{SETTINGS[n].description}"
        for n in table
    ]
    text = f"""# GRPO vs GDPO on the built-in addition task

Generated by `examples/gdpo/compare.py` (`{cmd}`); every number below is computed from `runs.json`
in the same folder, and the sentences are generated from those numbers.

Budget per run: {steps} steps of 32 prompts x 8 samples, two mini-batches per step, the shipped warm-up
model, one thread; seeds {", ".join(map(str, seeds))} (the same for both methods). Total wall time
{wall_s / 60:.1f} min on {os.cpu_count()} CPU core(s){f" (1-min load average at the end {load:.1f})" if load is not None else ""},
runs {"sequential" if args.workers <= 1 else f"in {args.workers} processes"}.

Settings:

{chr(10).join(settings_lines)}

## Results

Each component's mean over the last {window(steps)} steps (10%), mean ± std over seeds; greedy accuracy on all
100 problems after the last step; collapse rate = `multi_reward/collapse_rate` averaged over all steps (the
fraction of groups whose reward tuples differ but whose weighted sums are all equal: GRPO gets no signal
from them, GDPO does).

{report_table(table)}

![GRPO vs GDPO per component]({png_name})

## What it shows
{QUICK_NOTE if args.quick else ""}{budget_note(steps)}
"No difference beyond seed noise" means |Δ| ≤ max(0.05, 2 standard errors of the difference of the
seed means); "a clear difference" means more than that.

{chr(10).join("- " + s for s in lines_f)}

{conclusion(table, matches)}
{collapse_note(table)}
"""
    path.write_text(text)


# -- main ------------------------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description="GRPO vs GDPO on the built-in addition task (CPU).", allow_abbrev=False
    )
    p.add_argument(
        "--settings",
        nargs="+",
        choices=sorted(SETTINGS),
        default=None,
        help=f"settings to run (default: {' '.join(DEFAULTS['settings'])}; B is optional)",
    )
    p.add_argument(
        "--seeds", type=int, default=None, help=f"seeds 0..N-1 per method (default {DEFAULTS['seeds']})"
    )
    p.add_argument("--steps", type=int, default=None, help=f"RL steps per run (default {DEFAULTS['steps']})")
    p.add_argument(
        "--out", type=Path, default=HERE / "results", help="output folder (default examples/gdpo/results)"
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="worker processes (default 1: on 2 cores two workers measured slower than one)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"smoke configuration: settings {' '.join(QUICK['settings'])}, {QUICK['seeds']} seeds, "
        f"{QUICK['steps']} steps (explicit --settings/--seeds/--steps still win)",
    )
    p.add_argument(
        "--rebuild",
        action="store_true",
        help="re-render compare.png, report.md and summary.json from --out's runs.json (no training)",
    )
    args = p.parse_args(argv)
    base = QUICK if args.quick else DEFAULTS
    args.settings = list(args.settings or base["settings"])
    args.seeds = base["seeds"] if args.seeds is None else args.seeds
    args.steps = base["steps"] if args.steps is None else args.steps
    for flag, value in (("--seeds", args.seeds), ("--steps", args.steps), ("--workers", args.workers)):
        if value < 1:
            p.error(f"{flag} must be >= 1, got {value}")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.rebuild:
        # Re-render plot and report from a finished run's files (no training).
        runs = json.loads((args.out / "runs.json").read_text())
        saved = json.loads((args.out / "summary.json").read_text())
        wall_s, load = saved["wall_s"], saved.get("load_end")
        args.settings = list(dict.fromkeys(r["setting"] for r in runs))
        args.seeds = len({r["seed"] for r in runs})
        args.steps = len(runs[0]["history"])
        args.workers = saved.get("args", {}).get("workers", 1)
        args.quick = saved.get("args", {}).get("quick", False)
    else:
        # Interleave methods within a seed so a change of machine load hits both alike.
        jobs = [
            {"setting": s, "method": m, "seed": seed, "steps": args.steps}
            for s in args.settings
            for seed in range(args.seeds)
            for m in METHODS
        ]
        print(
            f"{len(jobs)} runs: settings {' '.join(args.settings)}, {args.seeds} seed(s), {args.steps} steps, "
            f"{args.workers} worker(s) -> {args.out}",
            flush=True,
        )
        t0 = time.perf_counter()
        runs = run_all(jobs, args.workers)
        wall_s = time.perf_counter() - t0
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        runs.sort(key=lambda r: (args.settings.index(r["setting"]), r["seed"], METHODS.index(r["method"])))
        (args.out / "runs.json").write_text(json.dumps(runs))
    table = aggregate(runs)
    run_args = {k: getattr(args, k) for k in ("settings", "seeds", "steps", "workers", "quick")}
    (args.out / "summary.json").write_text(
        json.dumps({"wall_s": wall_s, "load_end": load, "args": run_args, "table": table}, indent=1)
    )
    plot(runs, args.out / "compare.png")
    write_report(table, args.out / "report.md", wall_s=wall_s, load=load, args=args, png_name="compare.png")
    print(report_table(table))
    print(f"wall time {wall_s / 60:.1f} min; wrote {args.out / 'report.md'} and {args.out / 'compare.png'}")
    return table


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
