"""The GSM8K-style recipe's scripts: explain_rewards, the flags of both launch scripts, the CPU smoke run."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "examples" / "gdpo" / "gsm8k"
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def script_env(tmp_path) -> dict[str, str]:
    env = dict(os.environ)
    # the scripts call `python` and `relax`: use this interpreter's environment
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["OUTPUT_DIR"] = str(tmp_path / "out")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def test_explain_rewards_prints_both_methods_and_the_diagnostics(capsys):
    from examples.gdpo.gsm8k.explain_rewards import main

    metrics = main(["--group-size", "4", "--seed", "1"])
    text = capsys.readouterr().out
    assert "| correct, formatted | 1 | 1 | 1 |" in text
    assert "| no tags | 0 | 0 | 0 |" in text
    # scripted kinds vary every component, so each one gets a share of GDPO's advantage
    shares = [metrics[f"gdpo/{k}/adv_share"] for k in ("correctness", "format", "integer")]
    assert all(s > 0.2 for s in shares) and sum(shares) == pytest.approx(1.0)
    assert metrics["advantage/mean"] == pytest.approx(0.0, abs=1e-6)  # one whitened batch


@pytest.fixture(scope="module")
def tiny_qwen3(tmp_path_factory) -> Path:
    pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")
    sys.path.insert(0, str(REPO / "tests" / "hf"))
    from tiny_checkpoints import build_checkpoint

    return build_checkpoint(tmp_path_factory.mktemp("gsm8k_recipe") / "qwen3", "qwen3")


@pytest.mark.timeout(120)
def test_gpu_launch_script_flags_validate(tiny_qwen3, tmp_path):
    env = script_env(tmp_path) | {"MODEL_DIR": str(tiny_qwen3)}
    proc = subprocess.run(
        ["bash", str(RECIPE / "run_qwen3_0.6b_1gpu.sh"), "--dry-run"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=110,
    )
    assert proc.returncode == 0, proc.stderr
    assert "advantage_estimator: gdpo" in proc.stdout
    assert "- correctness\n- format\n- integer" in proc.stdout
    assert "custom_rm_path: examples.gdpo.gsm8k.reward:reward" in proc.stdout
    assert "<answer>" in proc.stdout  # the prompt suffix came from reward.PROMPT_SUFFIX


def test_gpu_launch_script_requires_model_dir(tmp_path):
    env = script_env(tmp_path)
    env.pop("MODEL_DIR", None)
    proc = subprocess.run(["bash", str(RECIPE / "run_qwen3_0.6b_1gpu.sh"), "--dry-run"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "MODEL_DIR" in proc.stderr


@pytest.mark.timeout(180)
def test_cpu_script_dry_run(tmp_path):
    pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")
    proc = subprocess.run(["bash", str(RECIPE / "run_cpu.sh"), "--dry-run"], env=script_env(tmp_path),
                          capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "GDPO step diagnostics" in proc.stdout
    assert "rollout_max_response_len: 24" in proc.stdout


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.skipif(
    importlib.util.find_spec("relax.runtime.driver.train") is None,
    reason="relax.runtime.driver.train is not present in this checkout (no runtime to train with)",
)
def test_cpu_script_trains_three_steps(tmp_path):
    pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")
    env = script_env(tmp_path)
    env.setdefault("RAY_TMPDIR", str(Path("/tmp") / f"r_gsm8k_{os.getpid()}"))
    proc = subprocess.run(["bash", str(RECIPE / "run_cpu.sh")], env=env, capture_output=True, text=True,
                          timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()
    assert len(metrics) == 3
    assert '"reward/correctness/mean"' in metrics[-1]
    # tiny_reward.py gives the tiny vocabulary a way to score, so some group carries a signal
    assert any(json.loads(row)["rollout/groups_kept"] > 0 for row in metrics)
