"""Demonstrations for ``relax sft``: a ``.jsonl`` / ``.parquet`` file of prompt/completion pairs or
chat conversations, checked row by row and tokenized once, before any model is built.

Two row formats (all rows of a file use the same one):

- a pair ``{"prompt": str, "completion": str}`` (``--prompt-key`` / ``--completion-key``): the prompt
  is context, the completion is trained on. Both are tokenized separately (the completion without
  special tokens), so the boundary is exact; the tokenizer's end-of-sequence token is appended to
  the completion unless it already ends with it, so the model learns to stop;
- a conversation ``{"messages": [{"role", "content"}, ...]}`` (``--messages-key``), rendered with the
  tokenizer's chat template: only the assistant turns are trained on. The tokens before the first
  assistant turn are the prompt; everything after it is the response, where the other turns are
  attended to but masked out of the loss (``TokenBatch.response_attention_mask``).

A bad row (not an object, a missing or misspelled key, an empty completion, a conversation without an
assistant turn) is an error naming the file, the row (its 1-based line, or Parquet row) and the key;
every bad row is listed (the first few, and how many), nothing is skipped silently.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import torch

from relax.config.sft import SftConfig
from relax.models.batch import TokenBatch
from relax.rollout.base import Tokenizer
from relax.rollout.data import PromptDataError, read_rows

DATA_FLAG = "--data"


@attrs.frozen
class SftExample:
    prompt_ids: tuple[int, ...]  # context: attended to, never trained on
    response_ids: tuple[int, ...]  # what follows the prompt
    loss_mask: tuple[bool, ...]  # per response token: trained on (the completion, an assistant turn)

    @property
    def num_loss_tokens(self) -> int:
        return sum(self.loss_mask)


class _RowError(ValueError):
    pass


def _continuation_ids(tokenizer: Tokenizer, text: str) -> list[int]:
    """``text``'s tokens as a continuation: without the BOS a Hugging Face tokenizer adds to a text."""
    hf = getattr(tokenizer, "hf", None)
    return list(hf.encode(text, add_special_tokens=False)) if hf is not None else list(tokenizer.encode(text))


def _text(row: Mapping, key: str, flag: str, *, allow_empty: bool = False) -> str:
    if key not in row:
        keys = ", ".join(map(repr, list(row)[:10])) or "none"
        raise _RowError(f"no key {key!r} ({flag}); the row's keys: {keys}")
    value = row[key]
    if not isinstance(value, str):
        raise _RowError(f"key {key!r} must be a string, got {type(value).__name__}")
    if not allow_empty and not value.strip():
        raise _RowError(f"key {key!r} is empty: a demonstration needs a non-empty {key}")
    return value


def pair_example(row: Mapping, tokenizer: Tokenizer, prompt_key: str, completion_key: str) -> SftExample:
    prompt = _text(row, prompt_key, "--prompt-key")
    completion = _text(row, completion_key, "--completion-key")
    prompt_ids = list(tokenizer.encode(prompt))
    completion_ids = _continuation_ids(tokenizer, completion)
    if not prompt_ids:
        raise _RowError(f"key {prompt_key!r}: the prompt has no tokens")
    if not completion_ids:
        raise _RowError(f"key {completion_key!r}: the completion has no tokens")
    if completion_ids[-1] != tokenizer.eos_id:
        completion_ids.append(tokenizer.eos_id)
    return SftExample(tuple(prompt_ids), tuple(completion_ids), (True,) * len(completion_ids))


def _messages(row: Mapping, key: str) -> list[dict]:
    if key not in row:
        keys = ", ".join(map(repr, list(row)[:10])) or "none"
        raise _RowError(f"no key {key!r} (--messages-key); the row's keys: {keys}")
    value = row[key]
    if not isinstance(value, (list, tuple)) or not value:
        raise _RowError(f"key {key!r} must be a non-empty list of {{'role', 'content'}} messages")
    for i, m in enumerate(value):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise _RowError(f"key {key!r}: message {i} must be {{'role': str, 'content': str}}, got {m!r}")
    messages = [{"role": m["role"], "content": m["content"]} for m in value]
    if not any(m["role"] == "assistant" for m in messages):
        raise _RowError(f"key {key!r}: the conversation has no assistant turn, so nothing would be trained on")
    if any(m["role"] == "assistant" and not m["content"].strip() for m in messages):
        raise _RowError(f"key {key!r}: an assistant turn is empty")
    if messages[0]["role"] == "assistant":
        raise _RowError(f"key {key!r}: the conversation starts with an assistant turn; give it a user turn first")
    return messages


def chat_example(row: Mapping, tokenizer: Tokenizer, messages_key: str) -> SftExample:
    """The conversation's tokens, rendered turn by turn: each assistant turn is the part of the
    conversation up to and including it that the rendering up to its generation prompt lacks."""
    hf = getattr(tokenizer, "hf", None)
    if hf is None or not getattr(hf, "chat_template", None):
        raise _RowError(
            f"key {messages_key!r}: chat messages need a tokenizer with a chat template (a --hf-checkpoint "
            "model that has one); give prompt/completion pairs for the built-in model"
        )
    messages = _messages(row, messages_key)

    def render(upto: int, generation_prompt: bool) -> list[int]:
        text = hf.apply_chat_template(messages[:upto], tokenize=False, add_generation_prompt=generation_prompt)
        return list(tokenizer.encode(text))

    ids = render(len(messages), False)
    trained = [False] * len(ids)
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before, through = render(i, True), render(i + 1, False)
        if before != through[: len(before)] or through != ids[: len(through)]:
            raise _RowError(
                f"key {messages_key!r}: the chat template does not render turn {i} as a continuation of the "
                "turns before it, so its tokens cannot be told apart"
            )
        trained[len(before) : len(through)] = [True] * (len(through) - len(before))
    first = trained.index(True)
    return SftExample(tuple(ids[:first]), tuple(ids[first:]), tuple(trained[first:]))


def read_sft_examples(
    path: str, tokenizer: Tokenizer, *, prompt_key: str = "prompt", completion_key: str = "completion",
    messages_key: str = "messages", flag: str = DATA_FLAG,
) -> list[SftExample]:
    """Every row of ``path`` as an ``SftExample``; ``PromptDataError`` lists the bad rows (file, row,
    key). The format is the first row's: a conversation when it has ``messages_key``, else a pair."""
    rows, unit = read_rows(path, flag)
    if not rows:
        raise ValueError(f"{flag} {path}: the file holds no rows; give at least one demonstration")
    first = rows[0][1]
    chat = isinstance(first, Mapping) and messages_key in first and prompt_key not in first
    examples, errors = [], []
    for number, row in rows:
        try:
            if not isinstance(row, Mapping):
                reason = getattr(row, "reason", None)  # read_rows's unparsable line
                raise _RowError(reason or f"must be a JSON object, got {type(row).__name__}")
            examples.append(chat_example(row, tokenizer, messages_key) if chat
                            else pair_example(row, tokenizer, prompt_key, completion_key))
        except _RowError as exc:
            errors.append((number, str(exc)))
    if errors:
        raise PromptDataError(path, errors, unit, flag)
    return examples


def sft_batch(examples: Sequence[SftExample], pad_id: int) -> TokenBatch:
    """A ``TokenBatch`` of ``examples``: prompts left-padded, responses right-padded; ``response_mask``
    is the loss mask, ``response_attention_mask`` the real response tokens (None when they agree). On the
    CPU, as the data arrives: the training backend moves it to the model's device."""
    width_p = max(len(e.prompt_ids) for e in examples)
    width_t = max(len(e.response_ids) for e in examples)
    prompt_ids = torch.full((len(examples), width_p), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((len(examples), width_p), dtype=torch.bool)
    response_ids = torch.full((len(examples), width_t), pad_id, dtype=torch.long)
    loss_mask = torch.zeros((len(examples), width_t), dtype=torch.bool)
    attended = torch.zeros((len(examples), width_t), dtype=torch.bool)
    for i, e in enumerate(examples):
        p, t = len(e.prompt_ids), len(e.response_ids)
        prompt_ids[i, width_p - p :] = torch.tensor(e.prompt_ids)
        prompt_mask[i, width_p - p :] = True
        response_ids[i, :t] = torch.tensor(e.response_ids)
        loss_mask[i, :t] = torch.tensor(e.loss_mask)
        attended[i, :t] = True
    same = bool(torch.equal(loss_mask, attended))
    return TokenBatch(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids,
                      response_mask=loss_mask, response_attention_mask=None if same else attended)


def row_summary(examples: Sequence[SftExample]) -> dict[str, Any]:
    """Counts for the start-up line: examples, trained tokens, longest sequence."""
    return {"examples": len(examples), "loss_tokens": sum(e.num_loss_tokens for e in examples),
            "max_len": max(len(e.prompt_ids) + len(e.response_ids) for e in examples)}


def demonstrations_of(sft: SftConfig, tokenizer) -> list[SftExample]:
    """The demonstrations ``relax sft`` trains on: ``--data`` read with its ``--prompt-key``,
    ``--completion-key`` and ``--messages-key``."""
    return read_sft_examples(sft.data, tokenizer, prompt_key=sft.prompt_key, completion_key=sft.completion_key,
                             messages_key=sft.messages_key)
