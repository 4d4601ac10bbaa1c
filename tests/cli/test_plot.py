"""``relax plot``: reward curves of one or several runs, and the plot written at the end of a run."""

from __future__ import annotations

import json
import random

import pytest

from relax.cli import plot as P

pytest.importorskip("matplotlib")


def _run(directory, rewards, step_s=0.5, extra=None):
    directory.mkdir(parents=True, exist_ok=True)
    lines = []
    for step, value in enumerate(rewards, 1):
        row = {"step": step, "reward/correct/mean": value, "reward/format/mean": 1.0 - value,
               "reward/combined/mean": 1.0, "reward/correct/std": 0.1, "time/step_s": step_s}
        row.update((extra or {}).get(step, {}))
        lines.append(json.dumps(row))
    (directory / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return directory


def _png_shape(path):
    import matplotlib.image

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return matplotlib.image.imread(path).shape


def test_two_runs_overlaid_into_one_figure(cli, tmp_path):
    grpo = _run(tmp_path / "grpo", [0.1, 0.2, 0.4])
    gdpo = _run(tmp_path / "gdpo", [0.1, 0.3], step_s=2.0, extra={2: {"eval/correct/mean": 0.5}})
    out = tmp_path / "figs" / "both.png"
    code, stdout, stderr = cli("plot", grpo, gdpo, "-o", out)
    assert code == 0, stderr
    assert stdout.strip() == str(out)
    height, width, _ = _png_shape(out)
    assert width == 1100 and height == 100 * (2.6 * 3 + 0.6)  # three components (eval next to train), two panels each


def test_one_run_defaults_to_its_directory(cli, tmp_path):
    run = _run(tmp_path / "one", [0.0, 1.0])
    code, stdout, _ = cli("plot", run)
    assert code == 0 and stdout.strip() == str(run / "rewards.png") and (run / "rewards.png").exists()


def test_curves_steps_and_cumulative_wall_time(tmp_path):
    rows = P.read_rows(_run(tmp_path / "r", [0.1, 0.2, 0.4], extra={2: {"reward/correct/mean": float("nan")}}))
    runs = [("r", rows), ("e", [{"step": 1, "eval/correct/mean": 0.5, "reward/digits/mean": 0.2}])]
    # one panel row per component: eval/correct/mean is drawn next to reward/correct/mean
    assert P.components(runs) == ["correct", "format", "digits", "combined"]
    assert P.components([("e", [{"step": 0, "eval/pass/mean": 1.0, "eval/correct/mean": 0.5},
                                {"step": 1, "reward/correct/mean": 0.2}])]) == ["correct", "pass"]
    # the NaN step is skipped; wall time keeps counting through it
    assert P.series(rows, "reward/correct/mean") == ([1, 3], [0.5, 1.5], [0.1, 0.4])
    assert P.moving_average([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]


def test_errors_exit_2_with_the_reason(cli, tmp_path):
    code, _, stderr = cli("plot", tmp_path / "missing")
    assert code == 2 and "no metrics.jsonl" in stderr
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "metrics.jsonl").write_text('{"step": 1, "actor/loss": 0.5}\n')
    code, _, stderr = cli("plot", tmp_path / "bare")
    assert code == 2 and "no reward/<key>/mean values" in stderr


def test_end_of_run_plot_says_where_and_never_fails(tmp_path, capsys):
    run = _run(tmp_path / "run", [0.1, 0.2])
    assert P.write_run_plot(run) == run / "rewards.png"
    assert capsys.readouterr().err == f"relax: reward curves: {run / 'rewards.png'}\n"
    (tmp_path / "empty").mkdir()
    assert P.write_run_plot(tmp_path / "empty") is None  # a run that logged nothing: no figure
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "metrics.jsonl").write_text('{not json\n{"step": 1, "reward/correct/mean": 0.5}\n')
    assert P.write_run_plot(broken) is None
    assert "could not plot the reward curves" in capsys.readouterr().err
    assert not (broken / "rewards.png").exists()


def test_damaged_metrics_files(cli, tmp_path):
    run = _run(tmp_path / "cut", [0.1, 0.2])
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 3, "reward/corr')  # what a kill -9 mid-write leaves
    code, out, err = cli("plot", run)
    assert code == 0 and out.strip() == str(run / "rewards.png")
    assert err.strip() == (f"relax plot: warning: {run / 'metrics.jsonl'}: line 3 is incomplete (24 bytes, not valid "
                           "JSON (Unterminated string starting at)), as a crash mid-write leaves it; dropped it")
    noise = tmp_path / "noise"
    noise.mkdir()
    (noise / "metrics.jsonl").write_bytes(random.Random(0).randbytes(4096))  # random bytes
    code, _, err = cli("plot", noise)
    assert code == 2 and "Traceback" not in err and err.count("relax plot: error:") == 1
    assert f"{noise / 'metrics.jsonl'}: line 1 is not" in err and "fix or delete that line" in err
    assert not (noise / "rewards.png").exists()
