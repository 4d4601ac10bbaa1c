"""A tiny random Qwen2 for the vLLM end-to-end runs."""

from __future__ import annotations

from pathlib import Path


def tiny_qwen2(directory: Path, seed: int = 0) -> Path:
    """``relax.models.hf.tiny_random``'s byte-level Qwen2 (its embeddings sized to the tokenizer as
    transformers loads it back: a ``Qwen2Tokenizer`` with ``<|endoftext|>`` added)."""
    from relax.models.hf.tiny_random import build_tiny_random_checkpoint

    return build_tiny_random_checkpoint(directory, "qwen2", seed=seed)
