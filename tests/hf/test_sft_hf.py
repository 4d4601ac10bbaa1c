"""``relax sft`` on a Hugging Face model: chat conversations, LoRA and bf16; the checkpoint's ``hf/`` is
a directory ``--hf-checkpoint`` takes, with the adapters merged in."""

from __future__ import annotations

import json

import pytest
import torch

from relax.cli.main import main
from relax.models.hf import load_hf_model
from relax.models.hf.tiny_random import build_tiny_random_checkpoint
from relax.runtime.preflight.model import check_hf_dir


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sft_chat_lora_bf16_writes_an_hf_checkpoint(tmp_path, capsys):
    base = build_tiny_random_checkpoint(tmp_path / "tiny-qwen3", "qwen3")
    data = tmp_path / "chats.jsonl"
    data.write_text("".join(json.dumps({"messages": [
        {"role": "user", "content": f"{i}+1?"}, {"role": "assistant", "content": str(i + 1)},
        {"role": "user", "content": "sure?"}, {"role": "assistant", "content": "yes"}]}) + "\n" for i in range(8)))
    out = tmp_path / "sft"
    code = main(["sft", "--data", str(data), "--hf-checkpoint", str(base), "--output-dir", str(out), "--batch-size", "4",
                 "--num-epochs", "4", "--lr", "1e-2", "--lora-rank", "4", "--bf16", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 0, err
    losses = [json.loads(line)["sft/loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 8 and losses[-1] < losses[0]
    step = out / "checkpoints" / "step_000008"
    assert json.loads((step / "sft.json").read_text())["model"] == "hf"
    check_hf_dir(str(step / "hf"), "--hf-checkpoint")  # what relax train --hf-checkpoint checks first
    assert (step / "hf" / "adapter").is_dir()
    trained, original = load_hf_model(step / "hf").state_dict(), load_hf_model(base).state_dict()
    q = next(k for k in original if k.endswith("q_proj.weight"))
    assert not torch.equal(trained[q], original[q])  # the adapter merged into a target module
    embed = next(k for k in original if k.endswith("embed_tokens.weight"))
    assert torch.equal(trained[embed], original[embed])  # LoRA trains the adapters only
