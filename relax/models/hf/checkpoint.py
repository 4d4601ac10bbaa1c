"""Save trained weights as a Hugging Face checkpoint (``save_pretrained``), loadable anywhere.

The directory gets ``config.json``, ``generation_config.json``, ``model.safetensors`` (sharded when
large) and the tokenizer files, so ``AutoModelForCausalLM.from_pretrained(DIR)`` and
``--hf-checkpoint DIR`` both work on it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import torch

from relax.models.hf.loading import HFTokenizer, load_hf_model, load_hf_state_dict, load_hf_tokenizer


def save_hf_checkpoint(
    model: torch.nn.Module,
    directory: str | os.PathLike,
    *,
    tokenizer: HFTokenizer | None = None,
    tokenizer_source: str | os.PathLike | None = None,
) -> Path:
    """``model.save_pretrained(directory)`` plus the tokenizer (given, or loaded from ``tokenizer_source``,
    usually the ``--hf-checkpoint`` the run started from). Returns the directory."""
    if tokenizer is None and tokenizer_source is None:
        raise ValueError(
            "save_hf_checkpoint needs tokenizer= or tokenizer_source= (a checkpoint without a "
            "tokenizer cannot be used with --hf-checkpoint)"
        )
    if not hasattr(model, "save_pretrained"):
        raise TypeError(f"{type(model).__name__} is not a transformers model (no save_pretrained)")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # no "Writing model shards" bars in a run's output
    model.save_pretrained(str(out), safe_serialization=True)
    if tokenizer is None:
        tokenizer = load_hf_tokenizer(tokenizer_source)
    tokenizer.hf.save_pretrained(str(out))
    return out


def export_hf_checkpoint(
    weights: Mapping[str, torch.Tensor], base_checkpoint: str | os.PathLike, directory: str | os.PathLike
) -> Path:
    """Write ``weights`` (e.g. ``TrainingBackend.export_weights()``) as a checkpoint with the config and
    tokenizer of ``base_checkpoint``: for a process that holds weights but not the HF module.

    A LoRA adapter payload (``--lora-rank``) gives the merged model in ``directory`` and the adapter
    alone, in PEFT's format, in ``directory/adapter``."""
    from relax.models.hf.lora import is_adapter_payload, save_adapter

    model = load_hf_model(base_checkpoint, dtype=None)
    load_hf_state_dict(model, weights)
    out = save_hf_checkpoint(model, directory, tokenizer_source=base_checkpoint)
    if is_adapter_payload(weights):
        save_adapter(weights, out / "adapter", base_model=base_checkpoint)
    return out
