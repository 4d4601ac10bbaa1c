"""``--config FILE.yaml``: read a flat mapping of settings, and write the effective configuration.

A key is a flag's dest (``n_samples_per_prompt``, ``lam``, ``rewards_normalization``) or its flag
name with or without dashes (``n-samples-per-prompt``, ``--lambd``, ``disable-rewards-normalization``).
For an on/off flag whose name differs from its dest, ``true`` means "the flag is given":
``disable_rewards_normalization: true`` is the same as ``rewards_normalization: false``.

Values go through the same type checks as on the command line; flags on the command line override
the file (the file's values become the parser's defaults), and the merged result is validated like
any other configuration. The effective configuration is written to ``<output_dir>/config.yaml`` in
dest names, so it can be passed back with ``--config`` to repeat a run (with a new ``--output-dir``:
the run's own directory is refused, see ``relax.runtime.files.run_dir``; ``overwrite_output_dir`` is always
written as false).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import attrs
import yaml

from relax.cli.suggest import closest
from relax.config.run import RunConfig

EFFECTIVE_CONFIG_NAME = "config.yaml"


class ConfigFileError(ValueError):
    """The configuration file is unreadable or holds a key or value that no flag accepts."""


_SWITCH_ACTIONS = (argparse._StoreTrueAction, argparse._StoreFalseAction)


def _key_table(parser: argparse.ArgumentParser) -> dict[str, tuple[argparse.Action, bool]]:
    """Normalized key -> (action, key_is_switch_flag). Dest names map to the value itself."""
    table: dict[str, tuple[argparse.Action, bool]] = {}
    for action in parser._actions:
        if action.dest in (argparse.SUPPRESS, "help", "config") or not action.option_strings:
            continue
        table[action.dest] = (action, False)
        for option in action.option_strings:
            key = option.lstrip("-").replace("-", "_")
            if key != action.dest:
                table[key] = (action, isinstance(action, _SWITCH_ACTIONS))
    return table


def _coerce(action: argparse.Action, key: str, value: Any, as_switch: bool) -> Any:
    """The value ``action.dest`` gets for ``key: value``; raises ConfigFileError with the key."""
    if as_switch:
        if not isinstance(value, bool):
            raise ConfigFileError(f"key {key!r} is an on/off flag: use true or false, got {value!r}")
        return action.const if value else action.default
    if isinstance(action, (*_SWITCH_ACTIONS, argparse.BooleanOptionalAction)):
        if not isinstance(value, bool):
            raise ConfigFileError(f"key {key!r} must be true or false, got {value!r}")
        return value
    if value is None:
        return None
    if isinstance(value, dict):
        raise ConfigFileError(
            f"key {key!r} must be a plain value, got a mapping (the file is flat: flag: value)"
        )
    if action.nargs in ("+", "*"):
        if isinstance(value, str):  # `reward_keys: correct format` means what the command line means
            items = value.replace(",", " ").split()
        else:
            items = list(value) if isinstance(value, (list, tuple)) else [value]
        if not items and action.nargs == "+":
            if action.default in ((), []):  # an empty default, as the effective configuration writes it
                return action.default
            raise ConfigFileError(f"key {key!r} needs at least one value")
        return [_convert(action, key, item) for item in items]
    if isinstance(value, (list, tuple)):
        raise ConfigFileError(f"key {key!r} takes a single value, got a list {value!r}")
    return _convert(action, key, value)


def _convert(action: argparse.Action, key: str, value: Any) -> Any:
    if isinstance(value, bool):
        raise ConfigFileError(f"key {key!r} takes a value, not {value!r}")
    if action.type is not None:
        try:
            # YAML already typed the value; argparse types expect text (and PyYAML reads 1e-6 as text).
            value = action.type(value if isinstance(value, str) else str(value))
        except (argparse.ArgumentTypeError, TypeError, ValueError) as exc:
            raise ConfigFileError(f"key {key!r}: {exc}") from None
    elif not isinstance(value, str):
        value = str(value)
    if action.choices is not None and value not in action.choices:
        raise ConfigFileError(f"key {key!r}: {value!r} is not one of {', '.join(map(str, action.choices))}")
    return value


class _UniqueKeyLoader(yaml.SafeLoader):
    """A YAML loader that refuses a key written twice (plain YAML silently keeps the last value)."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            try:
                key = self.construct_object(key_node, deep=deep)
                first = seen.setdefault(key, key_node.start_mark.line + 1)
            except TypeError:  # an unhashable key: let PyYAML report it
                continue
            if first != key_node.start_mark.line + 1:
                raise ConfigFileError(
                    f"key {key!r} is written twice (lines {first} and {key_node.start_mark.line + 1}); keep one"
                )
        return super().construct_mapping(node, deep)


def read_config_file(path: str | Path, parser: argparse.ArgumentParser) -> dict[str, Any]:
    """Parse ``path`` and return ``{dest: value}`` checked against ``parser``'s flags."""
    path = Path(path)
    try:
        data = yaml.load(path.read_text(), Loader=_UniqueKeyLoader)  # a SafeLoader subclass
    except OSError as exc:
        raise ConfigFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[: exc.start].count(b"\n") + 1
        raise ConfigFileError(
            f"{path} is not UTF-8 text (line {line}, byte offset {exc.start}: {exc.object[exc.start:exc.start + 1]!r}); "
            "save it as UTF-8"
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigFileError(f"{path} is not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigFileError(f"{path} must hold a mapping of flag: value, got {type(data).__name__}")
    table = _key_table(parser)
    values: dict[str, Any] = {}
    for raw_key, value in data.items():
        key = str(raw_key).lstrip("-").replace("-", "_")
        if key not in table:
            close = closest(key, table)
            hint = f"; did you mean {close!r}?" if close else "; see `relax train --help` for the flags"
            raise ConfigFileError(f"unknown key {raw_key!r} in {path}{hint}")
        action, as_switch = table[key]
        if action.dest in values:
            raise ConfigFileError(f"{path} sets {action.dest!r} twice (key {raw_key!r})")
        values[action.dest] = _coerce(action, str(raw_key), value, as_switch)
    return values


# -- the effective configuration --------------------------------------------------------------


def _plain(value):
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


def config_to_dict(config: RunConfig) -> dict[str, Any]:
    """Flat ``{dest: value}`` of a RunConfig (what ``--config`` reads back)."""
    flat: dict[str, Any] = {"advantage_estimator": config.advantage_estimator}
    flat.update({k: _plain(v) for k, v in attrs.asdict(config.algorithm, recurse=False).items()})
    for field in attrs.fields(RunConfig):
        if field.name not in ("algorithm", "advantage_estimator"):
            flat[field.name] = _plain(getattr(config, field.name))
    return flat


def write_effective_config(config: RunConfig, path: str | Path | None = None) -> Path:
    """Write ``config`` as YAML (default ``<output_dir>/config.yaml``) and return the path."""
    if path is None:
        if config.output_dir is None:
            raise ValueError("write_effective_config needs config.output_dir or an explicit path")
        path = Path(config.output_dir) / EFFECTIVE_CONFIG_NAME
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = (
        "# Effective relax configuration. Repeat the run with\n"
        "#   relax train --config this-file --output-dir NEW_DIR\n"
        "# (relax refuses to write over this run's directory: resume it with --load, or replace it with\n"
        "# --overwrite-output-dir, which this file never sets).\n"
    )
    values = config_to_dict(config)
    values["overwrite_output_dir"] = False  # reusing this file must never delete the run it describes
    path.write_text(header + yaml.safe_dump(values, sort_keys=False))
    return path
