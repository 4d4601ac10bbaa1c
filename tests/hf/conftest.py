"""Tiny random Hugging Face checkpoints built once per test session in a temporary directory."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")

sys.path.insert(0, str(Path(__file__).parent))
from tiny_checkpoints import build_checkpoint

FAMILIES = ("llama", "qwen2", "qwen3")


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """``{family: directory}`` of random llama / qwen2 / qwen3 models (~300k parameters each), plus
    ``"llama-tied"`` with tied input/output embeddings."""
    root = tmp_path_factory.mktemp("hf_checkpoints")
    out = {family: build_checkpoint(root / family, family, seed=i) for i, family in enumerate(FAMILIES)}
    out["llama-tied"] = build_checkpoint(root / "llama-tied", "llama", seed=7, tie=True)
    return out


@pytest.fixture(params=FAMILIES)
def family(request) -> str:
    return request.param
