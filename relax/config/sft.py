"""``SftConfig``: what ``relax sft`` needs besides the ``RunConfig`` fields it shares with ``relax train``.

``relax sft`` reads the demonstrations file and its keys from here; the model, optimizer, backend,
precision, LoRA, outputs, trackers and evaluation are the ``RunConfig`` fields of the same names
(``relax.cli.sft_cmd.SFT_RUN_FIELDS`` lists the ones it takes), so a flag means the same in both
commands. Each field declares its flag like ``RunConfig``'s (``relax.config.fields.flag``).
"""

from __future__ import annotations

import math

import attrs

from relax.config.fields import POSITIVE_INT, Text, flag

SFT_GROUP = "demonstrations"


@attrs.frozen(kw_only=True)
class SftConfig:
    data: str | None = attrs.field(default=None, metadata=flag(
        "the demonstrations: a .jsonl or .parquet file of {prompt, completion} pairs or of chat "
        "conversations {messages: [{role, content}, ...]} (required)", group=SFT_GROUP, metavar="FILE.jsonl"))
    prompt_key: str = attrs.field(default="prompt", metadata=flag(
        "the prompt field of a pair (context: never trained on)", group=SFT_GROUP, check=Text("a key")))
    completion_key: str = attrs.field(default="completion", metadata=flag(
        "the completion field of a pair (trained on; the end-of-sequence token is appended)", group=SFT_GROUP,
        check=Text("a key")))
    messages_key: str = attrs.field(default="messages", metadata=flag(
        "the conversation field (a list of {role, content}; only the assistant turns are trained on; needs a "
        "tokenizer with a chat template)", group=SFT_GROUP, check=Text("a key")))
    num_epochs: int = attrs.field(default=1, metadata=flag(
        "passes over the demonstrations, each in a fresh order drawn from --seed", group=SFT_GROUP,
        check=POSITIVE_INT))
    batch_size: int = attrs.field(default=16, metadata=flag(
        "demonstrations per optimizer step (the last batch of an epoch may be smaller)", group=SFT_GROUP,
        check=POSITIVE_INT))


def steps_per_epoch(num_examples: int, batch_size: int) -> int:
    return math.ceil(num_examples / batch_size)
