"""Prompt data from a file: ``--prompt-data FILE`` (``.jsonl`` or ``.parquet``).

Every row is validated and tokenized once, when the data set is loaded, so that a bad row stops
the run before any GPU time is spent, with its line number (1-based; for Parquet the row number):

- a row without ``--input-key`` (or ``--label-key`` / ``--metadata-key`` when set), a value of the
  wrong type, a line that is not a JSON object, or text the tokenizer rejects is an *error*; the
  error lists the first few bad rows and how many there are, nothing is skipped silently;
- a prompt longer than ``--max-prompt-len`` tokens is *dropped*; the drops are counted
  (``PromptDataset.num_too_long``) and reported in one warning.

Prompt text: the input value plus ``--prompt-suffix``. With ``--apply-chat-template`` it becomes the
user message of ``[system?, user]`` (``--system-prompt`` is a plain-string system message) rendered
by the tokenizer's chat template with the generation prompt appended; an input value that is
already a list of ``{"role", "content"}`` messages is used as is (the suffix goes to its last user
message).

The file's rows are read by ``prompt_files.read_rows``; ``prompt_iterator.PromptIterator`` walks the
prompts, resumably, for ``relax train``.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from collections.abc import Mapping
from typing import Any

from relax.config.run import RunConfig
from relax.rollout.base import Prompt, Tokenizer
from relax.rollout.prompt_files import MAX_LISTED_ERRORS, PromptDataError, Unparsable, read_rows
from relax.rollout.prompt_iterator import PromptIterator

logger = logging.getLogger(__name__)


class PromptDataset:
    """All usable prompts of a ``--prompt-data`` file, validated and length-filtered.

    ``label_key=None`` (or ``""``) means the data has no labels (``Prompt.label`` is None).
    """

    def __init__(
        self,
        path: str | os.PathLike,
        tokenizer: Tokenizer,
        *,
        input_key: str = "prompt",
        label_key: str | None = "label",
        metadata_key: str | None = None,
        apply_chat_template: bool = False,
        system_prompt: str | None = None,
        prompt_suffix: str | None = None,
        max_prompt_len: int | None = None,
        flag: str = "--prompt-data",
    ):
        if system_prompt is not None and not apply_chat_template:
            raise ValueError(
                "--system-prompt needs --apply-chat-template (a system message only exists in a chat template)"
            )
        if apply_chat_template and not callable(getattr(tokenizer, "apply_chat_template", None)):
            raise ValueError(
                f"--apply-chat-template: the tokenizer ({type(tokenizer).__name__}) has no chat template; "
                "drop the flag (the built-in tiny tokenizer has none) or use an HF checkpoint that has one"
            )
        if max_prompt_len is not None and max_prompt_len < 1:
            raise ValueError(f"--max-prompt-len must be >= 1, got {max_prompt_len}")
        self.path = str(path)
        self.flag = flag  # the flag that named the file, for messages (--prompt-data, --eval-prompt-data)
        self.key_flags = "--eval-" if flag == "--eval-prompt-data" else "--"  # --eval-input-key, ...
        self.tokenizer = tokenizer
        self.input_key = input_key
        self.label_key = label_key or None
        self.metadata_key = metadata_key or None
        self.apply_chat_template = apply_chat_template
        self.system_prompt = system_prompt
        self.prompt_suffix = prompt_suffix or ""
        self.max_prompt_len = max_prompt_len

        rows, self.unit = read_rows(path, flag)
        prompts: list[Prompt] = []
        lengths: list[int] = []
        line_numbers: list[int] = []
        errors: list[tuple[int, str]] = []
        too_long: list[tuple[int, int]] = []
        for number, row in rows:
            try:
                prompt, n_tokens = self._build(row)
            except _RowError as exc:
                errors.append((number, str(exc)))
                continue
            if max_prompt_len is not None and n_tokens > max_prompt_len:
                too_long.append((number, n_tokens))
                continue
            prompts.append(prompt)
            lengths.append(n_tokens)
            line_numbers.append(number)
        if errors:
            raise PromptDataError(self.path, errors, self.unit, flag)
        self.prompts: list[Prompt] = prompts
        self.prompt_lengths: list[int] = lengths  # token counts, aligned with ``prompts``
        self.line_numbers: list[int] = line_numbers  # source line of each prompt, for error messages
        self.num_rows = len(rows)
        self.num_too_long = len(too_long)
        if too_long:
            examples = ", ".join(f"{self.unit} {n} ({k} tokens)" for n, k in too_long[:MAX_LISTED_ERRORS])
            message = (
                f"{flag} {self.path}: dropped {len(too_long)} of {len(rows)} prompts longer than "
                f"--max-prompt-len {max_prompt_len} tokens, e.g. {examples}"
            )
            warnings.warn(message, stacklevel=2)
            logger.warning(message)
        if not rows:
            raise ValueError(
                f"{flag} {self.path}: the file holds no prompts "
                + ("(it is empty or only blank lines); give a file with one JSON object per line"
                   if self.unit == "line" else "(it has no rows); give a file with one row per prompt")
            )
        if not prompts:
            raise ValueError(
                f"{flag} {self.path}: no usable prompt: all {len(rows)} prompts are longer than "
                f"--max-prompt-len {max_prompt_len} tokens; raise --max-prompt-len"
            )

    def __len__(self) -> int:
        return len(self.prompts)

    def __getitem__(self, index: int) -> Prompt:
        return self.prompts[index]

    # -- one row -> Prompt --

    def _build(self, row: Any) -> tuple[Prompt, int]:
        if isinstance(row, Unparsable):
            raise _RowError(row.reason)
        if not isinstance(row, Mapping):
            raise _RowError(f"expected a JSON object, got {type(row).__name__}")
        if self.input_key not in row:
            raise _RowError(f"missing {self.key_flags}input-key {self.input_key!r} (keys: {_keys(row)})")
        label = None
        if self.label_key is not None:
            if self.label_key not in row:
                raise _RowError(
                    f"missing {self.key_flags}label-key {self.label_key!r} (keys: {_keys(row)}); pass {self.key_flags}label-key '' if the "
                    "data has no labels"
                )
            label = row[self.label_key]
        metadata: Mapping[str, Any] = {}
        if self.metadata_key is not None:
            if self.metadata_key not in row:
                raise _RowError(f"missing {self.key_flags}metadata-key {self.metadata_key!r} (keys: {_keys(row)})")
            metadata = row[self.metadata_key]
            if isinstance(metadata, str):  # metadata stored as a JSON string (common in Parquet files)
                try:
                    metadata = json.loads(metadata)
                except json.JSONDecodeError:
                    pass
            if not isinstance(metadata, Mapping):
                raise _RowError(
                    f"{self.key_flags}metadata-key {self.metadata_key!r} must hold an object, got {type(metadata).__name__}"
                )
        text = self._prompt_text(row[self.input_key])
        try:
            ids = self.tokenizer.encode(text)
        except Exception as exc:  # noqa: BLE001 - any tokenizer failure is this row's fault, reported by line
            raise _RowError(f"the tokenizer failed on {_short(text)}: {exc}") from None
        if len(ids) == 0:
            raise _RowError(f"the prompt {_short(text)} has no tokens")
        return Prompt(text=text, label=label, metadata=dict(metadata)), len(ids)

    def _prompt_text(self, value: Any) -> str:
        key = self.input_key
        if isinstance(value, str):
            if not self.apply_chat_template:
                return value + self.prompt_suffix
            messages = [{"role": "user", "content": value + self.prompt_suffix}]
        elif isinstance(value, list):
            if not self.apply_chat_template:
                has_template = callable(getattr(self.tokenizer, "apply_chat_template", None))
                raise _RowError(
                    f"{self.key_flags}input-key {key!r} holds a list of messages; that needs --apply-chat-template"
                    + ("" if has_template else
                       f" and a tokenizer with a chat template (an --hf-checkpoint that has one; the "
                       f"{type(self.tokenizer).__name__} has none), or plain-text prompts")
                )
            messages = _check_messages(value, key)
            users = [i for i, m in enumerate(messages) if m["role"] == "user"]
            if not users:
                raise _RowError(f"{self.key_flags}input-key {key!r}: the messages have no 'user' message")
            if self.prompt_suffix:
                last = users[-1]
                messages[last] = {**messages[last], "content": messages[last]["content"] + self.prompt_suffix}
        else:
            raise _RowError(
                f"{self.key_flags}input-key {key!r} must be a string or a list of messages, got {type(value).__name__}"
            )
        if self.system_prompt is not None:
            if any(m["role"] == "system" for m in messages):
                raise _RowError(
                    "the row has its own system message and --system-prompt is set; keep one of them"
                )
            messages = [{"role": "system", "content": self.system_prompt}, *messages]
        try:
            return self.tokenizer.apply_chat_template(messages)
        except Exception as exc:  # noqa: BLE001 - a template error is this row's, reported by line
            raise _RowError(f"the chat template failed: {exc}") from None


class _RowError(Exception):
    pass


def _keys(row: Mapping) -> str:
    keys = list(row)
    return ", ".join(map(repr, keys[:10])) + (" ..." if len(keys) > 10 else "") if keys else "none"


def _short(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _check_messages(value: list, key: str) -> list[dict]:
    messages = []
    for i, m in enumerate(value):
        if (
            not isinstance(m, Mapping)
            or not isinstance(m.get("role"), str)
            or not isinstance(m.get("content"), str)
        ):
            raise _RowError(
                f"--input-key {key!r}: message {i} must be {{'role': str, 'content': str}}, got {m!r}"
            )
        messages.append(dict(m))
    return messages


def prompt_dataset_from_config(config: RunConfig, tokenizer: Tokenizer) -> PromptDataset:
    """``PromptDataset`` for a ``RunConfig`` with ``prompt_data`` set."""
    if not config.prompt_data:
        raise ValueError("prompt_dataset_from_config needs --prompt-data")
    return PromptDataset(
        config.prompt_data,
        tokenizer,
        input_key=config.input_key,
        label_key=config.label_key,
        metadata_key=config.metadata_key,
        apply_chat_template=config.apply_chat_template,
        system_prompt=config.system_prompt,
        prompt_suffix=config.prompt_suffix,
        max_prompt_len=config.max_prompt_len,
    )


def eval_dataset_from_config(config: RunConfig, tokenizer: Tokenizer) -> PromptDataset:
    """``PromptDataset`` of ``--eval-prompt-data``: the keys default to the training ones, the prompt
    formatting (chat template, system prompt, suffix, length limit) is the training prompts'."""
    return PromptDataset(
        config.eval_prompt_data,
        tokenizer,
        input_key=config.eval_input_key or config.input_key,
        label_key=config.eval_label_key if config.eval_label_key is not None else config.label_key,
        metadata_key=config.eval_metadata_key if config.eval_metadata_key is not None else config.metadata_key,
        apply_chat_template=config.apply_chat_template,
        system_prompt=config.system_prompt,
        prompt_suffix=config.prompt_suffix,
        max_prompt_len=config.max_prompt_len,
        flag="--eval-prompt-data",
    )


def prompt_iterator_from_config(config: RunConfig, tokenizer: Tokenizer) -> PromptIterator:
    """The resumable prompt stream of ``relax train --prompt-data``, shuffled with ``--seed``."""
    return PromptIterator(prompt_dataset_from_config(config, tokenizer).prompts, seed=config.seed)
