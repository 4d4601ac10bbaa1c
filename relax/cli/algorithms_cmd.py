"""``relax algorithms``: the registered methods and their capabilities.

``relax algorithms`` prints a table, ``--json`` the same data for machines, and
``relax algorithms NAME`` (or ``package.module:ClassName``) one method's docstring, capabilities and
the flags of its ``hyperparameters``.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys

import attrs

from relax.algorithms import BUILTIN_ALGORITHMS, CAPABILITIES, load_algorithm
from relax.algorithms.base import RLAlgorithm
from relax.config.fields import flag_default, flag_of, option_strings

# Short column headings for the table; the legend under it spells each one out.
COLUMN_LABELS = {
    "needs_critic": "critic",
    "uses_reward_components": "multi-reward",
    "min_group_size": "min-n",
    "group_relative": "group",
    "supports_async": "async",
    "advantage_normalization": "adv-norm",
    "requires_rewards_normalization": "rew-norm",
    "allows_reward_post_process_hooks": "rew-hooks",
    "forbids_reward_side_kl": "no-rew-kl",
    "requires_global_token_loss": "token-loss",
    "requires_on_policy_updates": "on-policy",
    "kl_level": "kl-level",
    "needs_teacher": "teacher",
}


def _label(name: str) -> str:
    return COLUMN_LABELS.get(name, name.replace("_", "-"))


def _cell(value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "-"
    return str(value)


def algorithm_doc(cls: type[RLAlgorithm]) -> str:
    """The class's own docstring, else its module's (an inherited one describes another method)."""
    own = cls.__dict__.get("__doc__")
    if own and own.strip():
        return inspect.cleandoc(own)
    module = sys.modules.get(cls.__module__)
    if module is not None and module.__doc__ and module.__doc__.strip():
        return inspect.cleandoc(module.__doc__)
    return ""


def _summary(cls: type[RLAlgorithm]) -> str:
    doc = algorithm_doc(cls)
    return doc.splitlines()[0] if doc else ""


def _display_name(cls: type[RLAlgorithm]) -> str:
    # a subclass that names itself nothing is not its parent (ScaledGRPO inherits name = "grpo")
    return cls.__dict__.get("name") or f"{cls.__module__}:{cls.__qualname__}"


def describe_algorithm(cls: type[RLAlgorithm]) -> dict:
    """JSON-ready description of one algorithm class."""
    defaults = attrs.fields_dict(cls.Config)
    return {
        "name": _display_name(cls),
        "class": f"{cls.__module__}.{cls.__qualname__}",
        "summary": _summary(cls),
        "paper": cls.paper,
        "capabilities": cls.capabilities(),
        "hyperparameters": {h: _jsonable(defaults[h].default) for h in cls.hyperparameters},
    }


def _jsonable(value):
    if isinstance(value, attrs.Factory):
        return None
    if isinstance(value, tuple):
        return list(value)
    return value


def format_table(classes) -> str:
    """A plain-text table: one row per method, one column per capability, then a legend."""
    caps = list(CAPABILITIES)
    header = ["name", *(_label(c) for c in caps)]
    rows = [[_display_name(cls), *(_cell(getattr(cls, c)) for c in caps)] for cls in classes]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells):
        return "  ".join(cell.ljust(w) for cell, w in zip(cells, widths)).rstrip()

    out = [line(header), line(["-" * w for w in widths]), *(line(r) for r in rows), ""]
    out.append("Columns (capability attribute: meaning):")
    for c in caps:
        out.append(f"  {_label(c):<12} {c}: {CAPABILITIES[c].doc}")
    out.append("")
    out.append(
        "`relax algorithms NAME` shows one method; --advantage-estimator also takes 'package.module:Class'."
    )
    return "\n".join(out)


def format_details(cls: type[RLAlgorithm]) -> str:
    """Docstring, capabilities and hyper-parameter flags of one method."""
    out = [f"{_display_name(cls)}  ({cls.__module__}.{cls.__qualname__})", ""]
    doc = algorithm_doc(cls)
    if doc:
        out += [doc, ""]
    if cls.paper:
        out += [f"Paper: {cls.paper}", ""]
    out.append("Capabilities:")
    for name, value in cls.capabilities().items():
        out.append(f"  {name} = {value!r}  ({CAPABILITIES[name].doc})")
    out.append("")
    if cls.hyperparameters:
        out.append("Hyper-parameters (flag, default, help):")
        fields = attrs.fields_dict(cls.Config)
        for name in cls.hyperparameters:  # cls.Config field names (checked when the class is defined)
            field = fields[name]
            default = flag_default(field)
            shown = "" if default is None or isinstance(default, bool) else f" (default: {default})"
            out.append(f"  {', '.join(option_strings(field))}{shown}: {flag_of(field).help}")
    else:
        out.append("Hyper-parameters: none beyond the common flags (see `relax train --help`).")
    return "\n".join(out)


def add_algorithms_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "name",
        nargs="?",
        default=None,
        help="show one method (a registered name or 'package.module:ClassName')",
    )
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON instead of text")


def run_algorithms(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Entry point of ``relax algorithms``."""
    if args.name is None:
        if args.json:
            print(json.dumps([describe_algorithm(c) for c in BUILTIN_ALGORITHMS], indent=2))
        else:
            print(format_table(BUILTIN_ALGORITHMS))
        return 0
    try:
        cls = load_algorithm(args.name)
    except (KeyError, ValueError, TypeError) as exc:
        parser.error(exc.args[0] if exc.args else str(exc))
    if args.json:
        print(json.dumps(describe_algorithm(cls), indent=2))
    else:
        print(format_details(cls))
    sys.stdout.flush()
    return 0
