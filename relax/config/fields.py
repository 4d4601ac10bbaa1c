"""Configuration fields that declare their own command-line flag and value rule.

Every ``AlgorithmConfig`` / ``RunConfig`` field (and every field of a method's own ``Config``)
carries ``metadata=flag(...)``: its help text, its ``--help`` group, and its rule. The rule is stated
once, as an object (``Range``, ``OneOf``), and gives both the flag's value parser (argparse ``type`` /
``choices``) and the check of a value set in Python (``problem``), so a range is never written twice.
``relax.cli.arguments`` generates the ``relax train`` parser from these, and messages name a field's
flag through ``flag_name``.

Standard library and attrs only: this is the bottom of the package.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Iterator
from typing import Any

import attrs

# Flag.default when the flag defaults to the field's own default (the usual case).
FIELD_DEFAULT = object()


# -- rules -----------------------------------------------------------------------------------------


class Rule:
    """A value rule: ``parse`` reads a command-line string (argparse ``type``; raises
    ``argparse.ArgumentTypeError`` with the message argparse shows), ``problem`` says what is wrong
    with a value set in Python (None when it is fine)."""

    def parse(self, text):
        raise NotImplementedError

    def problem(self, value) -> str | None:
        raise NotImplementedError

    def __call__(self, text):  # a Rule is an argparse ``type``
        return self.parse(text)


@attrs.frozen
class Range(Rule):
    """A finite number within bounds: ``Range(gt=0)``, ``Range(ge=0, lt=1)``, ``Range(ge=1, integer=True)``.
    ``Range()`` is any finite number."""

    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    integer: bool = False

    @property
    def requirement(self) -> str:
        """The bounds as messages state them: ``> 0``, ``in [0, 1)``, ``>= 1``."""
        low = (f"({self.gt:g}", self.gt) if self.gt is not None else (f"[{self.ge:g}", self.ge) if self.ge is not None else None
        high = (f"{self.lt:g})", self.lt) if self.lt is not None else (f"{self.le:g}]", self.le) if self.le is not None else None
        if low and high:
            return f"in {low[0]}, {high[0]}"
        if low:
            return f"{'>' if self.gt is not None else '>='} {low[1]:g}"
        if high:
            return f"{'<' if self.lt is not None else '<='} {high[1]:g}"
        return "finite"

    def _outside(self, value) -> bool:
        return ((self.gt is not None and not value > self.gt) or (self.ge is not None and not value >= self.ge)
                or (self.lt is not None and not value < self.lt) or (self.le is not None and not value <= self.le))

    def parse(self, text):
        kind = int if self.integer else float
        if isinstance(text, bool):
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}")
        try:
            value = kind(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"expected {'an integer' if self.integer else 'a number'}, got {text!r}")
        if not self.integer and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be finite, got {text!r}")
        if self._outside(value):
            raise argparse.ArgumentTypeError(f"must be {self.requirement}, got {text!r}")
        return value

    def problem(self, value) -> str | None:
        if self.integer:
            if isinstance(value, bool) or not isinstance(value, int):
                return f"must be an integer {self.requirement}" if self.requirement != "finite" else "must be an integer"
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return "must be finite" if self.requirement == "finite" else f"must be finite and {self.requirement}"
        if self._outside(value):
            return f"must be {self.requirement}"
        return None


@attrs.frozen
class OneOf(Rule):
    """One of a fixed set of names (the flag's argparse ``choices``)."""

    choices: tuple[str, ...]

    def parse(self, text):
        return str(text)  # argparse checks ``choices`` itself, with its own message

    def problem(self, value) -> str | None:
        return None if value in self.choices else f"must be one of {', '.join(self.choices)}"


@attrs.frozen
class Text(Rule):
    """A non-empty name (a reward key, an algorithm spec)."""

    what: str = "value"

    def parse(self, text):
        text = str(text)
        if not text.strip():
            raise argparse.ArgumentTypeError(f"{self.what} must be a non-empty name")
        return text

    def problem(self, value) -> str | None:
        return None if isinstance(value, str) and value.strip() else f"{self.what} must be a non-empty name"


# The rules most fields use, by name.
FINITE = Range()
POSITIVE = Range(gt=0)
NON_NEGATIVE = Range(ge=0)
UNIT_INTERVAL = Range(ge=0, le=1)  # [0, 1]
INTEGER = Range(integer=True)
POSITIVE_INT = Range(ge=1, integer=True)
NON_NEGATIVE_INT = Range(ge=0, integer=True)
REWARD_KEY = Text("a reward key")


# -- flags -----------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Flag:
    """How one configuration field appears on the command line (see ``flag``)."""

    help: str
    group: str
    check: Rule | None = None
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

    ``check=`` a ``Rule`` gives the flag's parser (and ``choices`` for ``OneOf``) and the check of a
    value set in Python. An on/off field needs no rule: default False gives a ``store_true`` flag,
    default True a ``store_false`` one (which then needs a negated name in ``names``).
    """
    check = settings.get("check")
    if isinstance(check, OneOf):
        settings.setdefault("choices", check.choices)
    elif check is not None:
        settings.setdefault("type", check)
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


def field_problems(config) -> Iterator[tuple[attrs.Attribute, Any, str]]:
    """``(field, value, problem)`` for every field of ``config`` whose value breaks its flag's rule.

    None passes where the field defaults to None ("not set"); a list-valued flag's rule applies to
    each item.
    """
    for field in attrs.fields(type(config)):
        spec = field.metadata.get("flag")
        if spec is None or spec.check is None:
            continue
        value = getattr(config, field.name)
        if value is None and field.default is None:
            continue
        items = value if spec.nargs in ("+", "*") and isinstance(value, (tuple, list)) else (value,)
        for item in items:
            problem = spec.check.problem(item)
            if problem is not None:
                yield field, value, problem
                break
