"""Command-line flags declared on the configuration fields themselves.

Every ``AlgorithmConfig`` / ``RunConfig`` field carries ``metadata=flag(...)``: its help text, its
``--help`` group, its value parser and choices. ``relax.cli.arguments`` generates the ``relax train``
parser from these, and messages name a field's flag through ``flag_name``, so a flag is declared in
exactly one place. This lives in the algorithm layer (standard library and attrs only) because
``AlgorithmConfig``'s own messages name flags too.

The value parsers take a command-line string (or a ``--config`` value) and raise
``argparse.ArgumentTypeError`` with the message argparse shows.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

import attrs

# Flag.default when the flag defaults to the field's own default (the usual case).
FIELD_DEFAULT = object()


@attrs.frozen(kw_only=True)
class Flag:
    """How one configuration field appears on the command line (see ``flag``)."""

    help: str
    group: str
    type: Callable[[str], Any] | None = None
    choices: tuple | None = None
    metavar: str | None = None
    nargs: str | None = None
    # Option strings, for the few flags not spelled "--" + the field name (upstream Relax spellings
    # such as --lambd, negated switches such as --disable-rewards-normalization, aliases). The first
    # one is the name messages use.
    names: tuple[str, ...] = ()
    default: Any = FIELD_DEFAULT


def flag(help: str, **settings) -> dict:
    """attrs ``metadata`` declaring a field's flag; ``settings`` are the other ``Flag`` attributes.

    An on/off field needs no type: default False gives a ``store_true`` flag, default True a
    ``store_false`` one (which then needs a negated name in ``names``).
    """
    return {"flag": Flag(help=help, **settings)}


def flag_of(field: attrs.Attribute) -> Flag:
    try:
        return field.metadata["flag"]
    except KeyError:
        raise TypeError(f"configuration field {field.name!r} declares no flag: give it metadata=flag(...)")


def option_strings(field: attrs.Attribute) -> tuple[str, ...]:
    return flag_of(field).names or ("--" + field.name.replace("_", "-"),)


def flag_name(field: attrs.Attribute) -> str:
    """The flag that sets ``field``, as messages name it (``lam`` -> ``--lambd``)."""
    return option_strings(field)[0]


def flag_default(field: attrs.Attribute):
    """The flag's default: the field's, unless the flag declares its own (None = derived later)."""
    default = flag_of(field).default
    return field.default if default is FIELD_DEFAULT else default


# -- value parsers ---------------------------------------------------------------------------------


def _number(text, kind=float):
    if isinstance(text, bool):
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}")
    try:
        value = kind(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(
            f"expected {'an integer' if kind is int else 'a number'}, got {text!r}"
        )
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be finite, got {text!r}")
    return value


def integer(text) -> int:
    return _number(text, int)


def finite_float(text) -> float:
    return _number(text, float)


def non_negative_float(text) -> float:
    value = _number(text, float)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
    return value


def positive_float(text) -> float:
    value = _number(text, float)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def unit_interval(text) -> float:
    value = _number(text, float)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text!r}")
    return value


def open_unit_interval(text) -> float:
    value = _number(text, float)
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text!r}")
    return value


def non_negative_int(text) -> int:
    value = _number(text, int)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
    return value


def positive_int(text) -> int:
    value = _number(text, int)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text!r}")
    return value


def reward_key_name(text) -> str:
    text = str(text)
    if not text.strip():
        raise argparse.ArgumentTypeError("a reward key must be a non-empty name")
    return text
