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

``PromptIterator`` walks the data set epoch after epoch, in a fresh order per epoch derived only
from ``(seed, epoch)``, so its whole state is ``{epoch, position}`` and a resumed run draws exactly
the prompts the interrupted run would have drawn.
"""

from __future__ import annotations

import json
import logging
import os
import random
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from relax.config.run import RunConfig
from relax.rollout.base import Prompt, Tokenizer

logger = logging.getLogger(__name__)

MAX_LISTED_ERRORS = 5


class PromptDataError(ValueError):
    """Bad rows in ``--prompt-data``; ``errors`` holds every ``(line, message)``."""

    def __init__(self, path: str, errors: list[tuple[int, str]], unit: str, flag: str = "--prompt-data"):
        self.path = str(path)
        self.flag = flag
        self.errors = list(errors)
        self.unit = unit
        shown = "\n".join(f"  {unit} {line}: {msg}" for line, msg in errors[:MAX_LISTED_ERRORS])
        more = (
            f"\n  ... and {len(errors) - MAX_LISTED_ERRORS} more" if len(errors) > MAX_LISTED_ERRORS else ""
        )
        super().__init__(
            f"{flag} {path}: {len(errors)} bad {unit}{'s' if len(errors) != 1 else ''} "
            f"(fix or remove them; nothing is skipped silently):\n{shown}{more}"
        )

    def __reduce__(self):
        # Rebuilt from the constructor's arguments, so the error crosses Ray's process boundary intact
        # (the default reduce would call ``PromptDataError(message)`` and fail).
        return (type(self), (self.path, self.errors, self.unit, self.flag))


def read_rows(path: str | os.PathLike, flag: str = "--prompt-data") -> tuple[list[tuple[int, Any]], str]:
    """``[(line_number, row), ...]`` and the unit name ("line" or "row") of a JSONL / Parquet file.

    JSON that does not parse is returned as an ``_Unparsable`` row so that it is reported together
    with the other bad rows."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise FileNotFoundError(f"{flag} {str(path)!r} does not exist or is not a file")
    suffix = p.suffix.lower()
    if suffix in (".jsonl", ".json"):
        rows = []
        with p.open("rb") as f:
            for number, raw in enumerate(f, start=1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    rows.append((number, _Unparsable(
                        f"not UTF-8 text (byte {raw[exc.start]:#04x} at column {exc.start + 1}); "
                        "save the file as UTF-8"
                    )))
                    continue
                if number == 1:
                    line = line.removeprefix("\ufeff")  # a UTF-8 byte-order mark is not part of the row
                if not line.strip():
                    continue  # blank lines (e.g. a trailing newline) hold no row
                text = line.rstrip("\r\n")  # else an error at the line's end is "line 2, column 1"
                try:
                    rows.append((number, json.loads(text)))
                except json.JSONDecodeError as exc:
                    where = (f"at column {exc.pos + 1}" if exc.pos < len(text) else
                             f"at the end of the line, column {len(text) + 1}: is a closing }} or ] missing?")
                    rows.append((number, _Unparsable(f"not valid JSON ({exc.msg} {where})")))
        return rows, "line"
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ImportError(
                f"{flag} {str(path)!r} is a Parquet file, which needs pyarrow: pip install pyarrow "
                "(or pip install 'relax-rl[hf]'), or convert the file to JSONL."
            ) from None
        try:
            table = pq.read_table(str(p))
            rows = table.to_pylist()
        except Exception as exc:  # noqa: BLE001 - pyarrow raises ArrowInvalid, OSError, ... for a bad file
            raise ValueError(
                f"{flag} {str(path)!r} is not a readable Parquet file ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else 'no details'}); rewrite it (e.g. with pandas "
                "DataFrame.to_parquet) or convert it to JSONL"
            ) from None
        return [(i, row) for i, row in enumerate(rows, start=1)], "row"
    raise ValueError(
        f"{flag} {str(path)!r}: unknown file type {suffix!r}; use a .jsonl file (one JSON object per "
        "line) or a .parquet file"
    )


class _Unparsable:
    def __init__(self, reason: str):
        self.reason = reason


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
        if isinstance(row, _Unparsable):
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


class PromptIterator:
    """Endless, resumable walk over a data set: epoch after epoch, each in its own seeded order.

    ``state_dict()`` is ``{"epoch", "position", "seed", "num_prompts"}``; loading it into an
    iterator over the same data and seed continues exactly where the saved one stopped.
    """

    def __init__(self, prompts: Sequence[Prompt], *, seed: int = 1234, shuffle: bool = True):
        if len(prompts) == 0:
            raise ValueError("PromptIterator needs at least one prompt")
        self.prompts = prompts
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.position = 0
        self._order = self._order_of(0)

    def _order_of(self, epoch: int) -> list[int]:
        order = list(range(len(self.prompts)))
        if self.shuffle:
            # Depends only on (seed, epoch): resuming needs no RNG state.
            random.Random(f"relax-prompts/{self.seed}/{epoch}").shuffle(order)
        return order

    def __iter__(self) -> Iterator[Prompt]:
        return self

    def __next__(self) -> Prompt:
        if self.position >= len(self._order):
            self.epoch += 1
            self.position = 0
            self._order = self._order_of(self.epoch)
        prompt = self.prompts[self._order[self.position]]
        self.position += 1
        return prompt

    def next_batch(self, n: int) -> list[Prompt]:
        """The next ``n`` prompts (continuing into the next epoch when this one runs out)."""
        return [next(self) for _ in range(n)]

    def state_dict(self) -> dict[str, int]:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "num_prompts": len(self.prompts),
        }

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        if state.get("num_prompts") != len(self.prompts) or state.get("seed") != self.seed:
            raise ValueError(
                f"cannot resume the prompt iterator: the checkpoint was saved with {state.get('num_prompts')} "
                f"prompts and seed {state.get('seed')}, this run has {len(self.prompts)} prompts and seed "
                f"{self.seed} (same --prompt-data, --max-prompt-len and --seed are needed to resume)"
            )
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self._order = self._order_of(self.epoch)


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
