"""Build a tiny *random* Hugging Face checkpoint on disk, for trying the ``--hf-checkpoint`` path on
a CPU without downloading anything::

    python -m relax.models.hf.tiny_random /tmp/tiny-qwen3 --family qwen3

The tokenizer is byte-level (256 byte tokens + ``<pad> <bos> <eos> <|im_start|> <|im_end|>``, no
merges), so it encodes any text, and it carries a ChatML-style chat template; the model is a
Llama / Qwen2 / Qwen3 config of a few hundred thousand parameters with random weights. It learns
nothing useful: it exists to exercise loading, templating, generation, training and checkpoints.
``--reward-model`` writes a sequence-classification model with one logit instead (``--reward-model-path``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
FAMILIES = ("llama", "qwen2", "qwen3")


def model_config(family: str, vocab_size: int, *, tie: bool = False, hidden: int = 128, layers: int = 2):
    """A Llama / Qwen2 / Qwen3 config; with the defaults about 300k parameters plus the embeddings.
    Special token ids follow ``SPECIAL_TOKENS``: pad 0, bos 1, eos 2."""
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    common = {
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": tie,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
    }
    if family == "llama":
        return LlamaConfig(**common, rope_theta=10000.0)
    if family == "qwen2":
        return Qwen2Config(**common, rope_theta=10000.0)
    if family == "qwen3":
        return Qwen3Config(**common, head_dim=hidden // 4, rope_theta=10000.0)
    raise ValueError(f"unknown family {family!r}; choose one of {', '.join(FAMILIES)}")


def build_byte_tokenizer():
    """A byte-level BPE tokenizer without merges (one token per byte) plus the special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from tokenizers.pre_tokenizers import ByteLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in sorted(ByteLevel.alphabet()):
        vocab.setdefault(ch, len(vocab))
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def build_tiny_random_checkpoint(
    directory: str | Path,
    family: str = "qwen3",
    *,
    seed: int = 0,
    tie: bool = False,
    hidden: int = 128,
    layers: int = 2,
) -> Path:
    """Write tokenizer + random model to ``directory`` with ``save_pretrained``; return the path."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as transformers_logging

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tok = build_byte_tokenizer()
    tok.save_pretrained(str(directory))
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(
        model_config(family, len(tok), tie=tie, hidden=hidden, layers=layers)
    )
    # Chat models stop on <|im_end|> as well as <eos> (as Qwen's generation_config.json lists both).
    model.generation_config.eos_token_id = [2, tok.convert_tokens_to_ids("<|im_end|>")]
    transformers_logging.disable_progress_bar()  # no "Writing model shards" bar for a one-file model
    model.save_pretrained(str(directory))
    # Reloaded next to its config, the tokenizer may come back as the family's own class, which can
    # add a special token of its own (transformers 5 loads a qwen2 directory's tokenizer as
    # Qwen2Tokenizer, adding <|endoftext|>): size the embeddings for the tokenizer users will load.
    from transformers import AutoTokenizer

    loaded = len(AutoTokenizer.from_pretrained(str(directory), local_files_only=True))
    if loaded != model.config.vocab_size:
        model.resize_token_embeddings(loaded, mean_resizing=False)
        model.save_pretrained(str(directory))
    return directory


def build_tiny_reward_model(directory: str | Path, family: str = "qwen2", *, seed: int = 0,
                            hidden: int = 64, layers: int = 2) -> Path:
    """A random sequence-classification checkpoint with one logit (``num_labels=1``), the kind
    ``--reward-model-path`` serves, with the same byte-level tokenizer."""
    from transformers import AutoModelForSequenceClassification
    from transformers.utils import logging as transformers_logging

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tok = build_byte_tokenizer()
    tok.save_pretrained(str(directory))
    config = model_config(family, len(tok), hidden=hidden, layers=layers)
    config.num_labels = 1
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_config(config)
    transformers_logging.disable_progress_bar()
    model.save_pretrained(str(directory))
    # As for the causal checkpoint: only once config.json is there does the tokenizer reload as the
    # family's class (one token more for qwen2), so the size users will load is read after saving.
    from transformers import AutoTokenizer

    loaded = len(AutoTokenizer.from_pretrained(str(directory), local_files_only=True))
    if loaded != model.config.vocab_size:
        model.resize_token_embeddings(loaded, mean_resizing=False)
        model.save_pretrained(str(directory))
    return directory


def main(argv=None) -> None:
    first_paragraph = " ".join(__doc__.split("\n\n")[0].split())  # the whole sentence, not its first line
    parser = argparse.ArgumentParser(description=first_paragraph.rstrip(":") + ".", allow_abbrev=False)
    parser.add_argument("directory")
    parser.add_argument("--family", choices=FAMILIES, default="qwen3")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--tie-word-embeddings", action="store_true")
    parser.add_argument("--reward-model", action="store_true",
                        help="a sequence-classification model with one logit (for --reward-model-path)")
    args = parser.parse_args(argv)
    if args.reward_model:
        path = build_tiny_reward_model(args.directory, args.family, seed=args.seed, hidden=args.hidden,
                                       layers=args.layers)
        print(f"wrote a random {args.family} reward model to {path}")
        return
    path = build_tiny_random_checkpoint(
        args.directory,
        args.family,
        seed=args.seed,
        tie=args.tie_word_embeddings,
        hidden=args.hidden,
        layers=args.layers,
    )
    print(f"wrote a random {args.family} checkpoint to {path}")


if __name__ == "__main__":
    main()
