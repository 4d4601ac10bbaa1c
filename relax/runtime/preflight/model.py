"""Pre-flight of ``--hf-checkpoint`` / ``--ref-load``: the directory, its config and weights, the
tokenizer the rollout will use and the model's own checks (``relax.models.hf.checks``)."""

from __future__ import annotations

import json

from relax.config.run import RunConfig
from relax.runtime.preflight.common import PreflightError, builtin_task, first_line, quiet

WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin", "*.safetensors.index.json", "pytorch_model.bin.index.json")


def check_hf_dir(path: str, flag: str) -> None:
    """A local Hugging Face directory: ``config.json`` that transformers reads, and weight files."""
    from relax.models.hf.loading import check_checkpoint_dir

    try:
        p = check_checkpoint_dir(path, flag=flag)
    except (OSError, ValueError) as exc:
        raise PreflightError(first_line(exc)) from None
    try:
        json.loads((p / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PreflightError(
            f"{flag} {path}: config.json is not valid JSON ({first_line(exc)}); restore it from the model's source"
        ) from None
    if not any(next(p.glob(pattern), None) for pattern in WEIGHT_PATTERNS):
        raise PreflightError(
            f"{flag} {path}: no model weights (*.safetensors or pytorch_model*.bin) in the directory; copy "
            "the complete checkpoint (save_pretrained writes them next to config.json)"
        )
    try:
        import transformers

        with quiet():
            transformers.AutoConfig.from_pretrained(str(p), local_files_only=True)
    except ImportError:
        raise PreflightError(f"{flag} needs the 'transformers' package: pip install 'relax-rl[hf]'") from None
    except Exception as exc:  # noqa: BLE001 - unknown model_type, bad field: transformers' words, one line
        raise PreflightError(
            f"{flag} {path}: transformers cannot read its config.json ({first_line(exc).splitlines()[0]})"
        ) from None


def load_tokenizer(config: RunConfig):
    """The tokenizer the rollout will use: the HF checkpoint's or the built-in task's."""
    if config.hf_checkpoint:
        from relax.models.hf.loading import load_hf_tokenizer

        try:
            with quiet():
                return load_hf_tokenizer(config.hf_checkpoint)
        except Exception as exc:  # noqa: BLE001 - any failure to load the tokenizer, in one line
            message = first_line(exc).splitlines()[0].rstrip(": ")
            if not message.startswith("--hf-checkpoint"):
                message = f"--hf-checkpoint {config.hf_checkpoint}: cannot load the tokenizer ({type(exc).__name__}: {message})"
            raise PreflightError(
                f"{message}; the directory needs the tokenizer files save_pretrained writes (tokenizer.json or "
                "tokenizer.model / vocab files, and tokenizer_config.json)"
            ) from None
    return builtin_task(config).make_tokenizer()


def check_model(config: RunConfig, tokenizer) -> None:
    """``--hf-checkpoint``: a causal LM whose vocabulary covers the tokenizer, whose weight files are
    whole and match ``config.json``, with the ``--lora-target-modules`` it names
    (``relax.models.hf.checks``)."""
    if not config.hf_checkpoint:
        return
    from relax.models.hf.checks import check_hf_model

    with quiet():
        problem = check_hf_model(config, tokenizer)
    if problem:
        raise PreflightError(problem)
