"""``relax train --hf-checkpoint DIR --prompt-data FILE --advantage-estimator gdpo`` end to end on CPU
(Ray, TransferQueue, Serve), with a reward that has signal, so optimizer steps really happen; then
the runtime's checkpoint is exported to Hugging Face format and loaded back."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from relax.models.hf import export_hf_checkpoint, load_hf_model
from relax.models.hf.tiny_random import build_tiny_random_checkpoint

HERE = Path(__file__).parent


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_relax_train_gdpo_on_a_tiny_random_hf_model(tmp_path):
    ckpt = build_tiny_random_checkpoint(tmp_path / "tiny-qwen3", "qwen3")
    data = tmp_path / "prompts.jsonl"
    with data.open("w") as f:
        for i in range(12):
            f.write(json.dumps({"question": f"What is {i} + {i + 3}?", "answer": str(2 * i + 3)}) + "\n")
    shutil.copy(HERE / "toy_reward.py", tmp_path / "toy_reward.py")
    out = tmp_path / "out"
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("RAY_TMPDIR", f"/tmp/r_hf_{os.getpid()}")
    env.update(
        RAY_AUTH_MODE="disabled",
        RAY_USAGE_STATS_ENABLED="0",
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
        TQ_NUM_THREADS="2",
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
    )
    cmd = [
        "relax",
        "train",
        "--advantage-estimator",
        "gdpo",
        "--hf-checkpoint",
        str(ckpt),
        "--prompt-data",
        str(data),
        "--input-key",
        "question",
        "--label-key",
        "answer",
        "--apply-chat-template",
        "--system-prompt",
        "Answer with a number.",
        "--max-prompt-len",
        "200",
        "--custom-rm-path",
        "toy_reward:reward",
        "--reward-keys",
        "digits",
        "stops",
        "--num-rollout",
        "2",
        "--rollout-batch-size",
        "4",
        "--n-samples-per-prompt",
        "4",
        "--global-batch-size",
        "16",
        "--rollout-max-response-len",
        "16",
        "--lr",
        "1e-3",
        "--save-interval",
        "2",
        "--no-progress",
        "--output-dir",
        str(out),
    ]
    proc = subprocess.run(
        cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=280, check=False
    )
    print(proc.stdout[-4000:], proc.stderr[-4000:])  # shown by pytest if anything below fails
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    trained = [r for r in rows if not r.get("train/skipped")]
    assert trained and all(r["rollout/groups_kept"] > 0 for r in trained)
    for key in ("time/rollout_s", "time/advantages_s", "time/train_s"):
        assert all(r[key] > 0 for r in trained), key

    # The runtime's checkpoint holds the HF module's state_dict: export it with save_pretrained.
    state = torch.load(
        out / "checkpoints" / "step_000002" / "state.pt", map_location="cpu", weights_only=False
    )
    weights = state["actor"]["backend"]["model"]
    exported = export_hf_checkpoint(weights, ckpt, tmp_path / "hf-export")
    trained_model, initial = load_hf_model(exported), load_hf_model(ckpt)
    changed = [
        k for k, v in initial.state_dict().items() if not torch.equal(v, trained_model.state_dict()[k])
    ]
    assert changed, "the exported checkpoint equals the initial weights: no optimizer step reached it"


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_relax_train_ppo_with_a_value_head_on_a_tiny_random_hf_model(tmp_path):
    """PPO's critic is the Hugging Face model's decoder with a value head, trained through the torch
    backend: its loss is logged, and the head moves away from its zero initialization."""
    ckpt = build_tiny_random_checkpoint(tmp_path / "tiny-qwen2", "qwen2")
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i} + {i + 1} =", "label": str(2 * i + 1)}) + "\n"
                            for i in range(8)))
    shutil.copy(HERE / "toy_reward.py", tmp_path / "toy_reward.py")
    out = tmp_path / "out"
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("RAY_TMPDIR", f"/tmp/r_hf_{os.getpid()}")
    env.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", TQ_NUM_THREADS="2", OMP_NUM_THREADS="1",
               HF_HUB_OFFLINE="1")
    cmd = ["relax", "train", "--advantage-estimator", "ppo", "--hf-checkpoint", str(ckpt), "--prompt-data", str(data),
           "--custom-rm-path", "toy_reward:reward", "--reward-keys", "digits", "--num-rollout", "2",
           "--rollout-batch-size", "4", "--n-samples-per-prompt", "2", "--rollout-max-response-len", "8",
           "--critic-lr", "1e-2", "--save-interval", "2", "--no-progress", "--output-dir", str(out)]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=280, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["critic/value_loss"] >= 0 and r["critic/grad_norm"] > 0 for r in rows)
    state = torch.load(out / "checkpoints" / "step_000002" / "state.pt", map_location="cpu", weights_only=False)
    head = state["critic"]["model"]["head.weight"]
    assert head.abs().sum() > 0, "the value head never trained"
