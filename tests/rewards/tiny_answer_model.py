"""A tiny random Qwen2 checkpoint whose tokenizer has ``<answer>`` and ``</answer>`` as single tokens.

The byte-level tiny tokenizer (relax.models.hf.tiny_random) spells a tag as 8 separate bytes, which a
random model practically never samples in a row; as single tokens a random model emits them now and
then, so a reasoning-gym task's ``has_answer`` varies within a group and GRPO gets a signal.
"""

from __future__ import annotations

from pathlib import Path

import torch

TAGS = ["<answer>", "</answer>"]
SCALE = 2.0


def build_answer_checkpoint(directory: str | Path, *, seed: int = 0, scale: float = SCALE) -> Path:
    """``scale``: the tags' embedding rows, in standard deviations of the other rows."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from relax.models.hf.tiny_random import build_tiny_random_checkpoint

    directory = build_tiny_random_checkpoint(directory, "qwen2", seed=seed, hidden=64, layers=1)
    tok = AutoTokenizer.from_pretrained(str(directory))
    tok.add_tokens(TAGS)
    model = AutoModelForCausalLM.from_pretrained(str(directory))
    torch.manual_seed(seed)
    model.resize_token_embeddings(len(tok), mean_resizing=False)
    # The new rows at the scale of the old ones (the checkpoint's init is larger than the default), a
    # bit larger still: the tags are then among the likelier tokens without being certain.
    with torch.no_grad():
        for matrix in (model.get_input_embeddings().weight, model.get_output_embeddings().weight):
            old = matrix[: -len(TAGS)]
            matrix[-len(TAGS):] = torch.randn(len(TAGS), matrix.shape[1]) * old.std() * scale
    tok.save_pretrained(str(directory))
    model.save_pretrained(str(directory))
    return directory
