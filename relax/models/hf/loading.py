"""Load a causal LM and its tokenizer from a local Hugging Face checkpoint directory.

Nothing is ever downloaded: every ``from_pretrained`` call passes ``local_files_only=True``, and a
path that is not a directory holding a ``config.json`` fails before transformers is asked, with a
message that says what was expected.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

_CHECKPOINT_HINT = (
    "Pass the local directory of a Hugging Face checkpoint (the folder holding config.json, the "
    "model weights *.safetensors and the tokenizer files), e.g. one written by `save_pretrained` or "
    "by `huggingface-cli download <repo> --local-dir DIR` on a machine with internet access. "
    "relax never downloads anything."
)


def _require_transformers():
    try:
        import transformers
    except ImportError as exc:  # pragma: no cover - transformers is part of the 'hf' extra
        raise ImportError(
            "Hugging Face checkpoints need the 'transformers' package: pip install 'relax-rl[hf]'"
        ) from exc
    transformers.utils.logging.disable_progress_bar()  # no "Loading checkpoint shards" bars in a run's output
    return transformers


def check_checkpoint_dir(path: str | os.PathLike, *, flag: str = "--hf-checkpoint") -> Path:
    """Return ``path`` as a ``Path`` if it looks like a local HF checkpoint, else raise ``ValueError``."""
    p = Path(path).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"{flag} {str(path)!r} does not exist. {_CHECKPOINT_HINT}")
    if not p.is_dir():
        raise ValueError(f"{flag} {str(path)!r} is a file, not a directory. {_CHECKPOINT_HINT}")
    if not (p / "config.json").is_file():
        present = sorted(x.name for x in p.iterdir())[:10]
        raise ValueError(
            f"{flag} {str(path)!r} has no config.json, so it is not a Hugging Face checkpoint "
            f"(it contains: {', '.join(present) or 'nothing'}). {_CHECKPOINT_HINT}"
        )
    return p


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    """``"float32" | "bfloat16" | "float16" | torch.dtype | None`` -> ``torch.dtype`` (None: the default)."""
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    names = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
    }
    try:
        return names[str(dtype)]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(names)}") from None


def load_hf_model(
    path: str | os.PathLike,
    *,
    dtype: str | torch.dtype | None = torch.float32,
    device: str | torch.device = "cpu",
    flag: str = "--hf-checkpoint",
    attn_implementation: str | None = "sdpa",
) -> torch.nn.Module:
    """``AutoModelForCausalLM`` from a local directory, in ``dtype`` on ``device``, in train mode off.

    float32 is the default because the log-probs of the rollout engine and of the trainer must agree;
    pass ``dtype="bfloat16"`` on GPU for large models. Dropout is turned off (``eval()``): RL log-probs
    must be deterministic functions of the weights.
    """
    p = check_checkpoint_dir(path, flag=flag)
    transformers = _require_transformers()
    kwargs: dict[str, Any] = {"local_files_only": True}
    if dtype is not None:
        kwargs["dtype"] = resolve_dtype(dtype)
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(str(p), **kwargs)
    except (OSError, ValueError, KeyError) as exc:
        raise ValueError(
            f"{flag} {str(path)!r}: transformers could not load a causal LM from it: {exc}. {_CHECKPOINT_HINT}"
        ) from exc
    return model.to(device).eval()


class HFTokenizer:
    """A Hugging Face tokenizer behind relax's ``Tokenizer`` protocol (``pad_id``, ``eos_id``,
    ``encode``, ``decode``), plus ``apply_chat_template`` and ``stop_ids``.

    ``encode`` adds the tokenizer's special tokens (e.g. Llama's BOS) like ``tokenizer(text)`` does,
    but never doubles a BOS that the text already starts with (a chat template usually writes it).
    Models without a pad token (Llama, many base models) pad with the EOS id: padding is always
    masked out, so the id only has to be valid.
    """

    def __init__(self, hf_tokenizer, *, extra_stop_ids: Sequence[int] = ()):
        self.hf = hf_tokenizer
        eos = hf_tokenizer.eos_token_id
        if eos is None:
            raise ValueError(
                f"the tokenizer at {getattr(hf_tokenizer, 'name_or_path', '?')!r} has no eos_token: generation "
                "could never stop. Set eos_token in tokenizer_config.json."
            )
        self.eos_id: int = int(eos)
        pad = hf_tokenizer.pad_token_id
        self.pad_id: int = int(pad) if pad is not None else self.eos_id
        self.bos_id: int | None = hf_tokenizer.bos_token_id
        # Every id that ends a response: the tokenizer's EOS and the generation config's (Qwen chat
        # models stop on <|im_end|>, which generation_config.json lists next to <|endoftext|>).
        self.stop_ids: tuple[int, ...] = tuple(dict.fromkeys([self.eos_id, *map(int, extra_stop_ids)]))

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.hf, "chat_template", None))

    def encode(self, text: str) -> list[int]:
        ids = list(self.hf(text, add_special_tokens=True)["input_ids"])
        if self.bos_id is not None and len(ids) >= 2 and ids[0] == ids[1] == self.bos_id:
            ids = ids[1:]
        return ids

    def decode(self, ids, *, skip_special_tokens: bool = False) -> str:
        return self.hf.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]]) -> str:
        """The prompt text for ``messages`` with the generation prompt appended (not tokenized)."""
        if not self.has_chat_template:
            raise ValueError(
                f"--apply-chat-template: the tokenizer at {getattr(self.hf, 'name_or_path', '?')!r} has no "
                "chat template (tokenizer_config.json 'chat_template' or chat_template.jinja). Drop the flag "
                "for a base model, or use an instruct checkpoint."
            )
        return self.hf.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)


def _generation_config_stop_ids(path: Path) -> list[int]:
    import json

    cfg_file = path / "generation_config.json"
    if not cfg_file.is_file():
        return []
    eos = json.loads(cfg_file.read_text()).get("eos_token_id")
    if eos is None:
        return []
    return [int(e) for e in (eos if isinstance(eos, list) else [eos])]


def load_hf_tokenizer(path: str | os.PathLike, *, flag: str = "--hf-checkpoint") -> HFTokenizer:
    """``AutoTokenizer`` from a local directory, wrapped as ``HFTokenizer``."""
    p = check_checkpoint_dir(path, flag=flag)
    transformers = _require_transformers()
    try:
        tok = transformers.AutoTokenizer.from_pretrained(str(p), local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise ValueError(f"{flag} {str(path)!r}: transformers could not load its tokenizer: {exc}") from exc
    return HFTokenizer(tok, extra_stop_ids=_generation_config_stop_ids(p))


def load_hf_state_dict(model: torch.nn.Module, weights: Mapping[str, torch.Tensor]) -> None:
    """``model.load_state_dict(weights, strict=True)`` with an error that lists the name mismatch.

    Tied embeddings: ``lm_head.weight`` may be absent from ``weights`` when the model ties it to the
    input embedding (both names then refer to one tensor). A LoRA adapter payload
    (``relax.models.hf.lora``, what a ``--lora-rank`` trainer sends) is merged into the model's base
    weights instead."""
    from relax.models.hf.lora import is_adapter_payload, merge_adapter

    if is_adapter_payload(weights):
        merge_adapter(model, weights)
        return
    own = model.state_dict()
    missing = [k for k in own if k not in weights]
    unexpected = [k for k in weights if k not in own]
    if getattr(model.config, "tie_word_embeddings", False):
        tied = {"lm_head.weight"}
        missing = [k for k in missing if k not in tied]
    if missing or unexpected:
        raise KeyError(
            "weights do not match the Hugging Face model's parameter names: "
            f"missing {missing[:5]}{' ...' if len(missing) > 5 else ''}, "
            f"unexpected {unexpected[:5]}{' ...' if len(unexpected) > 5 else ''}. "
            "The trainer must export the HF module's own state_dict names (no wrapper prefix)."
        )
    for name, value in weights.items():
        target = own[name]
        if target.shape != value.shape:
            raise ValueError(f"weight {name!r}: shape {tuple(value.shape)} != model's {tuple(target.shape)}")
        target.copy_(value)
