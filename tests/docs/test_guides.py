"""Execute the code of the guides in docs/en and docs/zh, so that it cannot rot.

A fenced block preceded by a marker comment is executed; unmarked blocks are prose:

- ``<!-- test: file PATH -->``: written to PATH in a fresh temporary directory;
- ``<!-- test: python -->``: the guide's python blocks run, in order, as one script (like a notebook)
  in that directory, with it on ``PYTHONPATH``;
- ``<!-- test: pytest PATH -->``: written to PATH and run with pytest;
- ``<!-- test: relax-train -->``: a ``relax train`` command line; always validated with ``--dry-run``,
  and run for real (marked ``ray``) when the runtime exists.

The English and Chinese versions must carry the same code, block for block.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
LANGUAGES = ("en", "zh")
GUIDES = ("adding-an-algorithm.md", "gdpo.md")
BLOCK_RE = re.compile(r"<!-- test: (?P<kind>[\w-]+)(?: (?P<arg>\S+))? -->\s*\n```(?P<lang>\w+)\n(?P<code>.*?)^```", re.S | re.M)


def blocks(language: str, guide: str) -> list[tuple[str, str | None, str]]:
    text = (DOCS / language / guide).read_text(encoding="utf-8")
    return [(m["kind"], m["arg"], m["code"]) for m in BLOCK_RE.finditer(text)]


def env_for(directory: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(directory), env.get("PYTHONPATH")) if p)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def materialize(language: str, guide: str, directory: Path) -> tuple[str, list[str], list[str]]:
    """Write the guide's files; return (python script, pytest paths, relax train commands)."""
    script, tests, commands = [], [], []
    for kind, arg, code in blocks(language, guide):
        if kind in ("file", "pytest"):
            path = directory / arg
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(code, encoding="utf-8")
            if kind == "pytest":
                tests.append(arg)
        elif kind == "python":
            script.append(code)
        elif kind == "relax-train":
            commands.append(code.strip())
        else:
            raise AssertionError(f"{language}/{guide}: unknown test marker {kind!r}")
    return "\n".join(script), tests, commands


def run(cmd, directory: Path, timeout: int, extra_env=None) -> subprocess.CompletedProcess:
    env = env_for(directory) | (extra_env or {})
    proc = subprocess.run(cmd, cwd=directory, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd!r} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.mark.parametrize("guide", GUIDES)
def test_both_languages_carry_the_same_code(guide):
    en, zh = blocks("en", guide), blocks("zh", guide)
    assert en, f"docs/en/{guide} has no executable block"
    assert en == zh, f"docs/en/{guide} and docs/zh/{guide} differ in their executable blocks"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("language", LANGUAGES)
@pytest.mark.parametrize("guide", GUIDES)
def test_python_blocks_run(language, guide, tmp_path):
    script, _, _ = materialize(language, guide, tmp_path)
    if not script:
        pytest.skip(f"{language}/{guide} has no python block to run")
    (tmp_path / "guide_script.py").write_text(script, encoding="utf-8")
    run([sys.executable, "guide_script.py"], tmp_path, timeout=110)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("language", LANGUAGES)
def test_adding_an_algorithm_tests_pass(language, tmp_path):
    _, tests, _ = materialize(language, "adding-an-algorithm.md", tmp_path)
    assert tests
    proc = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests], tmp_path, timeout=110)
    assert " passed" in proc.stdout and "failed" not in proc.stdout


def train_command(language: str, tmp_path: Path, *extra: str) -> list[str]:
    _, _, commands = materialize(language, "adding-an-algorithm.md", tmp_path)
    assert len(commands) == 1
    command = commands[0].replace("\\\n", " ")
    return ["bash", "-c", command + "".join(f" {e}" for e in extra)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("language", LANGUAGES)
def test_relax_train_command_validates(language, tmp_path):
    proc = run(train_command(language, tmp_path, "--dry-run"), tmp_path, timeout=110)
    assert "advantage_estimator: my_pkg.my_algo:MyAlgo" in proc.stdout


@pytest.mark.ray
@pytest.mark.timeout(300)
@pytest.mark.skipif(
    importlib.util.find_spec("relax.runtime.driver.train") is None,
    reason="relax.runtime.driver.train is not present in this checkout (no runtime to train with)",
)
def test_relax_train_command_trains(tmp_path):
    ray_env = {"RAY_TMPDIR": os.environ.get("RAY_TMPDIR", f"/tmp/r_guide_{os.getpid()}")}
    run(train_command("en", tmp_path, "--no-progress"), tmp_path, timeout=280, extra_env=ray_env)
    metrics = (tmp_path / "outputs" / "my_algo" / "metrics.jsonl").read_text().splitlines()
    # three training steps, after the held-out evaluation of the initial policy (step 0)
    assert [json.loads(line)["step"] for line in metrics] == [0, 1, 2, 3]
