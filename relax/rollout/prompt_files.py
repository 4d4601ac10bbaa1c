"""The rows of a prompt file (``.jsonl`` or ``.parquet``), and the error that lists its bad rows.

``read_rows`` gives every row with its line number (1-based; for Parquet the row number); a line
that is not UTF-8 or not JSON comes back as an ``Unparsable`` row, so that ``PromptDataset`` reports
it together with the other bad rows in one ``PromptDataError``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

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

    JSON that does not parse is returned as an ``Unparsable`` row so that it is reported together
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
                    rows.append((number, Unparsable(
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
                    rows.append((number, Unparsable(f"not valid JSON ({exc.msg} {where})")))
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


class Unparsable:
    """A row that could not be read (not UTF-8, not JSON): reported with the other bad rows."""

    def __init__(self, reason: str):
        self.reason = reason
