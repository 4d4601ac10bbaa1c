"""Without matplotlib the end of a run says why there is no ``rewards.png`` and how to get it."""

from __future__ import annotations

import sys

from relax.cli.plot import EXTRA_HINT, write_run_plot


def test_a_missing_matplotlib_is_said_with_the_fix(tmp_path, monkeypatch, capsys):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "reward/correct/mean": 0.5}\n')
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    assert write_run_plot(tmp_path) is None
    err = capsys.readouterr().err
    assert "relax: no reward-curve plot: matplotlib is not installed" in err
    assert EXTRA_HINT in err and f"relax plot {tmp_path}" in err
    assert not (tmp_path / "rewards.png").exists()


def test_nothing_is_said_for_a_run_that_logged_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert write_run_plot(tmp_path) is None
    assert capsys.readouterr().err == ""


def test_the_quick_start_install_brings_the_promised_plot_and_the_hint_names_the_same_extra():
    import re
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    readme = (root / "README.md").read_text()
    quick_start = readme.split("## Quick start", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    extra = re.search(r"pip install -e '\.\[(\w+)\]'", quick_start)
    assert extra, f"the quick start installs no extra: {quick_start.strip()}"
    extras = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(dep.startswith("matplotlib") for dep in extras[extra.group(1)])  # rewards.png needs it
    assert f"'.[{extra.group(1)}]'" in EXTRA_HINT
