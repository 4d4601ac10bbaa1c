"""``relax plot RUN_DIR [RUN_DIR ...] [-o FILE.png]``: reward curves of one or several runs.

One row of panels per reward component (``reward/<key>/mean`` of ``metrics.jsonl``, then the
combined reward), the left panel against the training step, the right one against wall time (the
cumulative ``time/step_s``). The evaluation of the same component (``eval/<key>/mean``, from
``--eval-*``, docs/en/evaluation.md) is drawn in the same panel, dashed with markers, next to the
training curve. Runs are overlaid, each in its colour under its directory name. Long runs are drawn
faintly per step with a moving average on top.

matplotlib is optional (the ``plot`` or ``tracking`` extra) and imported only here, with the
non-interactive Agg backend. ``write_run_plot`` is what the end of ``relax train`` calls to leave
``rewards.png`` in the run directory; it never fails the run.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

PLOT_NAME = "rewards.png"
EXTRA_HINT = "pip install matplotlib, or in a checkout pip install -e '.[plot]' (the README's quick start)"
_CURVE = re.compile(r"^(reward|eval)/(?P<key>[^/]+)/mean$")


class PlotError(Exception):
    pass


def read_rows(run_dir: Path) -> list[dict]:
    """The rows of ``RUN_DIR/metrics.jsonl`` (``relax.runtime.files.metrics_log.read_metrics``: a partial last
    line is dropped with a warning on stderr; another damaged line is a ``PlotError`` naming it)."""
    from relax.runtime.files.metrics_log import MetricsFileError, read_metrics

    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise PlotError(f"{run_dir}: no metrics.jsonl (is this a run directory of relax train?)")
    try:
        rows, warning = read_metrics(path)
    except (MetricsFileError, OSError) as exc:
        raise PlotError(str(exc)) from None
    if warning:
        print(f"relax plot: warning: {warning}", file=sys.stderr)
    return rows


def components(runs: Sequence[tuple[str, list[dict]]]) -> list[str]:
    """Every component with a ``reward/<key>/mean`` or ``eval/<key>/mean`` curve in any run: those
    trained on first, in the order the runs logged them, ``combined`` last among them, then
    components that only have an evaluation curve."""
    seen: dict[str, bool] = {}  # component -> has a training curve
    for _, rows in runs:
        for row in rows:
            for name in row:
                match = _CURVE.match(name)
                if match:
                    seen[match["key"]] = seen.get(match["key"], False) or match.group(1) == "reward"
    return sorted(seen, key=lambda k: (not seen[k], k == "combined"))


def series(rows: list[dict], name: str) -> tuple[list[int], list[float], list[float]]:
    """``(steps, wall-clock seconds since the first step started, values)`` of one curve."""
    steps, times, values, clock = [], [], [], 0.0
    for row in rows:
        clock += float(row.get("time/step_s", 0.0) or 0.0)
        value = row.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            steps.append(int(row["step"]))
            times.append(clock)
            values.append(float(value))
    return steps, times, values


def moving_average(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def plot_runs(run_dirs: Sequence[str | Path], output: str | Path) -> Path:
    """Draw the reward curves of ``run_dirs`` into ``output`` (PNG); returns its path."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlotError(f"plotting needs matplotlib ({exc}); {EXTRA_HINT}") from exc
    runs = []
    for run_dir in run_dirs:
        path = Path(run_dir)
        runs.append((path.resolve().name or str(path), read_rows(path)))
    keys = components(runs)
    if not keys:
        raise PlotError(f"no reward/<key>/mean values in {', '.join(map(str, run_dirs))}")
    fig, axes = plt.subplots(len(keys), 2, figsize=(11, 2.6 * len(keys) + 0.6), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for row_axes, key in zip(axes, keys):
        for index, (label, rows) in enumerate(runs):
            color = colors[index % len(colors)]
            steps, times, values = series(rows, f"reward/{key}/mean")
            window = max(1, len(values) // 25)
            for ax, x in zip(row_axes, (steps, times)):
                if not steps:
                    break
                if window > 1:
                    ax.plot(x, values, color=color, alpha=0.25, linewidth=0.8)
                    ax.plot(x, moving_average(values, window), color=color, label=label, linewidth=1.6)
                else:
                    ax.plot(x, values, color=color, label=label, linewidth=1.6, marker="." if len(x) < 30 else None)
            steps, times, values = series(rows, f"eval/{key}/mean")  # held-out, next to the training curve
            for ax, x in zip(row_axes, (steps, times)):
                if steps:
                    ax.plot(x, values, color=color, linestyle="--", marker="o", markersize=4, linewidth=1.2,
                            label=f"{label} (eval)")
        row_axes[0].set_ylabel(key, fontsize=9)
        row_axes[0].set_xlabel("step")
        row_axes[1].set_xlabel("wall time (s)")
        for ax in row_axes:
            ax.grid(alpha=0.3)
    axes[0][1].legend(fontsize=8, loc="best")
    fig.suptitle("reward curves: " + ", ".join(label for label, _ in runs), fontsize=10)
    fig.tight_layout()
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    # written next to its place, then renamed: a full disk never leaves a truncated or empty image
    partial = output.with_name(f".{output.name}.partial")
    try:
        fig.savefig(partial, dpi=100, format=output.suffix.lstrip(".") or "png")
        os.replace(partial, output)
    finally:
        plt.close(fig)
        partial.unlink(missing_ok=True)
    return output


def write_run_plot(run_dir: str | Path) -> Path | None:
    """``<run_dir>/rewards.png`` at the end of a run when matplotlib is installed and the run logged
    a step; says where on stderr, or why there is none. Never raises: a plot must not fail a finished run."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        if (Path(run_dir) / "metrics.jsonl").is_file():
            print(f"relax: no reward-curve plot: matplotlib is not installed ({EXTRA_HINT}; then "
                  f"`relax plot {run_dir}` draws it)", file=sys.stderr)
        return None
    try:
        if not (Path(run_dir) / "metrics.jsonl").is_file() or not read_rows(Path(run_dir)):
            return None
        path = plot_runs([run_dir], Path(run_dir) / PLOT_NAME)
    except Exception as exc:  # noqa: BLE001 - a plot never fails a run
        print(f"relax: could not plot the reward curves: {exc}", file=sys.stderr)
        return None
    print(f"relax: reward curves: {path}", file=sys.stderr)
    return path


def add_plot_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories (with metrics.jsonl)")
    parser.add_argument(
        "-o", "--output", default=None, metavar="FILE.png",
        help=f"where the figure goes (default: RUN_DIR/{PLOT_NAME} for one run, ./{PLOT_NAME} for several)",
    )


def run_plot(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    output = args.output or (Path(args.run_dirs[0]) / PLOT_NAME if len(args.run_dirs) == 1 else Path(PLOT_NAME))
    try:
        path = plot_runs(args.run_dirs, output)
    except PlotError as exc:
        parser.error(str(exc))
    print(path)
    return 0
