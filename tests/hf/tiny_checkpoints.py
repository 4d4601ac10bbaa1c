"""Build tiny random Hugging Face checkpoints (Llama / Qwen2 / Qwen3) and a tiny tokenizer on disk.

Used by the tests and by ``benchmarks/hf_rollout.py``; nothing is downloaded. The tokenizer is a
``tokenizers`` WordLevel model over a fixed word list (digits, arithmetic, a few words, chat special
tokens) with a ChatML-style chat template, so ``--apply-chat-template`` can be exercised.
"""

from __future__ import annotations

from pathlib import Path

import torch

WORDS = (
    [str(d) for d in range(10)]
    + ["+", "-", "=", "?", ".", ",", ":", "what", "is", "the", "answer", "sum", "of", "and", "think", "step"]
    + ["by", "system", "user", "assistant", "you", "are", "a", "helpful", "bot", "add", "numbers", "please"]
    + ["hello", "world", "yes", "no", "<unk>"]
)
SPECIAL = ["<pad>", "<bos>", "<eos>", "<|im_start|>", "<|im_end|>"]

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages %}<|im_start|> {{ m['role'] }} : {{ m['content'] }} <|im_end|> {% endfor %}"
    "{% if add_generation_prompt %}<|im_start|> assistant : {% endif %}"
)


def build_tokenizer(directory: str | Path):
    """A WordLevel tokenizer (whitespace + punctuation split) saved with ``save_pretrained``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL + WORDS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.WhitespaceSplit(),
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.Punctuation(),
        ]
    )
    # Like Llama: a BOS is prepended by tokenizer(text) (add_special_tokens=True).
    core.post_processor = processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", vocab["<bos>"])]
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(str(directory))
    return tok


def model_config(family: str, vocab_size: int, *, tie: bool = False):
    """A config of a few hundred thousand parameters for ``family`` in {llama, qwen2, qwen3}."""
    from relax.models.hf.tiny_random import model_config as _model_config

    return _model_config(family, vocab_size, tie=tie)


def build_checkpoint(
    directory: str | Path, family: str = "llama", *, seed: int = 0, tie: bool = False
) -> Path:
    """Write a random ``family`` model + the tiny tokenizer to ``directory`` (``save_pretrained``)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as transformers_logging

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(directory)
    torch.manual_seed(seed)
    config = model_config(family, len(tok), tie=tie)
    model = AutoModelForCausalLM.from_config(config)
    # Larger-than-default init so the random model's next-token distributions are far from uniform:
    # sampling, top-p and EOS paths are then exercised on peaked, row-dependent distributions.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2)
    transformers_logging.disable_progress_bar()  # no "Writing model shards" bar (run_cpu.sh prints this)
    model.save_pretrained(str(directory))
    return directory
