"""Pre-flight's checks of a ``--hf-checkpoint`` directory against itself and its tokenizer, before Ray
starts (``relax.runtime.preflight`` calls ``check_hf_model``). Each returns the problem as one message
(or None); nothing is loaded but ``config.json``, the weight files' headers and a skeleton of the model
on the ``meta`` device (no memory for the weights).

- the architecture is a causal language model (an encoder-only checkpoint such as BERT fails later
  with a broadcast-shape error);
- ``vocab_size`` covers the tokenizer (a smaller embedding fails at the first step with
  ``IndexError: index out of range in self``);
- each ``*.safetensors`` file is as long as its header says (a truncated copy) and its tensors have
  the shapes ``config.json`` implies (a config edited after saving);
- ``--lora-target-modules`` names modules the model has.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

# Architecture names of causal language models (transformers' naming convention).
CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel")


def _text_config(cfg):
    getter = getattr(cfg, "get_text_config", None)
    return getter() if callable(getter) else cfg


def architecture_problem(cfg, flag: str, path: str) -> str | None:
    architectures = list(getattr(cfg, "architectures", None) or [])
    if getattr(cfg, "is_encoder_decoder", False) or (
            architectures and not any(a.endswith(CAUSAL_SUFFIXES) for a in architectures)):
        what = ", ".join(architectures) or f"model_type {cfg.model_type!r}, an encoder-decoder"
        return (f"{flag} {path}: the checkpoint is a {what}, not a causal language model; relax trains decoder-only "
                "models (architectures ending in ForCausalLM, e.g. LlamaForCausalLM)")
    return None


def vocabulary_problem(cfg, tokenizer, flag: str, path: str) -> str | None:
    vocab = getattr(_text_config(cfg), "vocab_size", None)
    tokens = getattr(tokenizer, "vocab_size", None)  # relax's HFTokenizer: len() of the HF tokenizer
    if not isinstance(tokens, int):
        return None
    if isinstance(vocab, int) and vocab < tokens:
        return (f"{flag} {path}: config.json has vocab_size {vocab} but the tokenizer has {tokens} tokens, so token "
                f"ids {vocab}..{tokens - 1} would index past the embedding; use the tokenizer saved with this model, "
                "or resize the embeddings (model.resize_token_embeddings(len(tokenizer))) and save both again")
    return None


def safetensors_header(file: Path) -> tuple[dict, int]:
    """``(tensors, expected file size)`` from a safetensors file's header; ValueError when unreadable."""
    with open(file, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError("shorter than a safetensors header")
        (size,) = struct.unpack("<Q", head)
        if size > 100 * 2**20:
            raise ValueError(f"a header of {size} bytes, which is not a safetensors file")
        raw = f.read(size)
    if len(raw) < size:
        raise ValueError("its header is cut short")
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"its header is not valid JSON ({exc})") from None
    tensors = {k: v for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)}
    end = max((int(v["data_offsets"][1]) for v in tensors.values() if "data_offsets" in v), default=0)
    return tensors, 8 + size + end


def _expected_shapes(model) -> dict[str, tuple[int, ...]]:
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


def _match(name: str, expected: dict) -> str | None:
    """The model's parameter a checkpoint tensor name stands for (with or without a base-model prefix)."""
    if name in expected:
        return name
    for candidate in expected:
        if candidate.endswith("." + name) or name.endswith("." + candidate):
            return candidate
    return None


def weights_problem(directory: Path, model, flag: str, path: str) -> str | None:
    expected = _expected_shapes(model) if model is not None else {}
    for file in sorted(directory.glob("*.safetensors")):
        try:
            tensors, size = safetensors_header(file)
        except (OSError, ValueError) as exc:
            return f"{flag} {path}: {file.name} is not a readable safetensors file ({exc}); copy it again"
        actual = file.stat().st_size
        if actual < size:
            return (f"{flag} {path}: {file.name} is truncated ({actual} bytes, its header describes {size}); copy the "
                    "file again")
        for name, info in tensors.items():
            target = _match(name, expected)
            shape = tuple(info.get("shape", ()))
            if target is not None and expected[target] != shape:
                return (f"{flag} {path}: {file.name} holds {name} of shape {shape}, but config.json describes "
                        f"{expected[target]}; the config was changed after the weights were saved: restore the "
                        "config.json saved with them")
    return None


def lora_problem(model, targets, flag: str = "--lora-target-modules") -> str | None:
    if model is None or not targets or tuple(targets) == ("all-linear",):
        return None
    import torch

    names = [n for n, _ in model.named_modules() if n]
    missing = [t for t in targets if not any(n == t or n.endswith("." + t) for n in names)]
    if not missing:
        return None
    linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
    return (f"{flag} {' '.join(targets)}: the model has no module named {', '.join(missing)}; its linear layers "
            f"are {', '.join(linear) or 'none'} (or pass all-linear)")


def meta_model(cfg):
    """The model's skeleton on the meta device (shapes only), or None when transformers cannot build it."""
    import torch
    import transformers

    try:
        with torch.device("meta"):
            return transformers.AutoModelForCausalLM.from_config(cfg)
    except Exception:  # noqa: BLE001 - an architecture transformers cannot build: left to the loader
        return None


def check_hf_model(config, tokenizer) -> str | None:
    """The first problem of ``config.hf_checkpoint`` (see the module docstring), or None."""
    if not config.hf_checkpoint:
        return None
    import transformers

    flag, path = "--hf-checkpoint", config.hf_checkpoint
    cfg = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
    problem = architecture_problem(cfg, flag, path) or vocabulary_problem(cfg, tokenizer, flag, path)
    if problem:
        return problem
    model = meta_model(cfg)
    return weights_problem(Path(path), model, flag, path) or (
        lora_problem(model, config.lora_target_modules) if config.lora_rank else None)
