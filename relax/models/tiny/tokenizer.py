"""The 17-token vocabulary of the built-in addition task.

Vocabulary (id: token)::

    0 <pad>   1 <bos>   2 <eos>   3..12 the digits 0..9   13 +   14 =   15 <a>   16 </a>

The answer tags are *single* tokens: a randomly initialised model spelling ``< a >`` out of three
tokens gets no format signal at all (measured, see ``docs/en/embedded-default.md``).

Text form: tokens are written next to each other without separators, e.g. ``"<bos>3+4="`` and
``"<a>7</a><eos>"``; whitespace is ignored by ``encode``. ``decode`` keeps every special token
visible (``<eos>`` included), so a reward function that only sees the completion text can tell
whether the model stopped. ``decode`` drops ``<pad>`` only when asked (``skip_pad=True``), so
nothing is hidden by default.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
OPEN_TAG, CLOSE_TAG = "<a>", "</a>"
DIGITS = tuple(str(d) for d in range(10))
VOCAB: tuple[str, ...] = (PAD, BOS, EOS, *DIGITS, "+", "=", OPEN_TAG, CLOSE_TAG)


def token_pattern(vocab: Iterable[str]) -> re.Pattern:
    """One match per token of ``vocab``, per whitespace run, or per other character (an error).
    Longest alternatives first so "</a>" is not read as "<" + ..."""
    return re.compile("|".join(re.escape(t) for t in sorted(vocab, key=len, reverse=True)) + r"|\s+|.")


class TinyTokenizer:
    """Implements the ``relax.rollout.base.Tokenizer`` protocol for ``VOCAB``."""

    vocab: tuple[str, ...] = VOCAB
    vocab_size: int = len(VOCAB)
    pad_id: int = VOCAB.index(PAD)
    bos_id: int = VOCAB.index(BOS)
    eos_id: int = VOCAB.index(EOS)
    open_id: int = VOCAB.index(OPEN_TAG)
    close_id: int = VOCAB.index(CLOSE_TAG)
    digit_ids: tuple[int, ...] = tuple(VOCAB.index(d) for d in DIGITS)
    name: str = "tiny"  # how encode's errors name the tokenizer
    token_re: re.Pattern = token_pattern(VOCAB)

    def __init__(self) -> None:
        self._ids = {tok: i for i, tok in enumerate(self.vocab)}

    def encode(self, text: str) -> list[int]:
        """Text -> token ids. Raises ``ValueError`` naming the first character not in the vocabulary."""
        ids = []
        for match in self.token_re.finditer(text):
            piece = match.group(0)
            if piece.isspace():
                continue
            if piece not in self._ids:
                raise ValueError(
                    f"cannot encode {piece!r} at position {match.start()} of {text!r}: the {self.name} tokenizer "
                    f"knows only {' '.join(self.vocab)}"
                )
            ids.append(self._ids[piece])
        return ids

    def decode(self, ids: Iterable[int], *, skip_pad: bool = False) -> str:
        """Token ids -> text, special tokens included (``<eos>`` stays visible)."""
        out = []
        for i in ids:
            i = int(i)
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"token id {i} is outside the tiny vocabulary (0..{self.vocab_size - 1})")
            if skip_pad and i == self.pad_id:
                continue
            out.append(self.vocab[i])
        return "".join(out)

    def is_digit(self, token_id: int) -> bool:
        return token_id in self.digit_ids

    def digit_value(self, token_id: int) -> int:
        return self.digit_ids.index(token_id)
