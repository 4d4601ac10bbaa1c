"""A successful run's output holds no library noise: no "Writing model shards" bars when relax writes
a Hugging Face checkpoint, and no transformers FutureWarning when LoRA wraps the model."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest

pytest.importorskip("transformers", reason="the hf extra is not installed")


def test_writing_a_tiny_random_checkpoint_prints_no_progress_bar(tmp_path):
    done = subprocess.run([sys.executable, "-m", "relax.models.hf.tiny_random", str(tmp_path / "ck")],
                          capture_output=True, text=True, timeout=300, check=True)
    assert "Writing model shards" not in done.stderr and "%|" not in done.stderr, done.stderr
    assert (tmp_path / "ck" / "config.json").is_file()


def test_lora_wrapping_raises_no_future_warning(tmp_path):
    pytest.importorskip("peft", reason="the lora extra (peft) is not installed")
    from relax.models.hf import load_hf_model
    from relax.models.hf.lora import wrap_with_lora
    from relax.models.hf.tiny_random import build_tiny_random_checkpoint

    model = load_hf_model(build_tiny_random_checkpoint(tmp_path / "ck", "qwen3", hidden=32, layers=1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        wrapped = wrap_with_lora(model, rank=2, alpha=4.0, dropout=0.0, target_modules=["q_proj"])
    assert [str(w.message) for w in caught if issubclass(w.category, FutureWarning)] == []
    assert any("lora_A" in name for name, _ in wrapped.named_parameters())
