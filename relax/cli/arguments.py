"""The ``relax train`` argument parser, generated from the configuration fields.

Every ``RunConfig`` field and every field of the method's ``Config`` (``AlgorithmConfig`` and the
method's own hyper-parameters) declares its flag in attrs metadata (``relax.config.fields.flag``):
help text, ``--help`` group, rule, and the option strings where they differ from the field name
(upstream Relax spellings such as ``--lambd``). Flag names and defaults follow upstream Relax where
it has the flag. A flag's ``dest`` is the field it sets, so a ``--config`` file may use either the
dest or the flag name. This module adds only what no field can say: the groups' order and
descriptions, ``--config``, the registered names and the help formatter.

The parse has two phases, because the flags depend on the method: ``method_of_command_line`` finds
``--advantage-estimator`` (on the command line, else in the ``--config`` file) and loads the class,
then the parser is built from its ``Config``. The flags of the other built-in methods are accepted
too, so that one given to the wrong method is reported as doing nothing rather than as unknown.

Nothing here imports ray: ``relax train --help`` and validation run without it.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import attrs
import yaml

from relax.algorithms import BUILTIN_ALGORITHMS, algorithm_names, load_algorithm
from relax.algorithms.base import RLAlgorithm
from relax.backends.registry import backend_names
from relax.config.fields import flag_default, flag_of, option_strings
from relax.config.run import RunConfig
from relax.rollout.registry import engine_names

CONFIG_FILE_GROUP = "configuration file"
RUN_FIELD_NAMES = {f.name for f in attrs.fields(RunConfig)}

# The --help groups, in order: (title, description). A field's flag names its group by title.
GROUPS = (
    ("algorithm", "Which RL method runs, and its hyper-parameters."),
    ("rewards", "Reward components and reward hooks."),
    ("reward services", "A reward model and an LLM judge on Ray Serve (docs/en/rewards.md#reward-services)."),
    (
        "batch shape",
        (
            "samples per rollout = rollout-batch-size x n-samples-per-prompt, split into "
            "num-steps-per-rollout optimizer mini-batches of global-batch-size samples (whole prompt "
            "groups each). Give at most one of --global-batch-size / --num-steps-per-rollout; when neither "
            "is given, num-steps-per-rollout is 1 for methods that require on-policy updates and otherwise "
            "2 when the groups split evenly (the embedded recipe learns fastest with two mini-batch updates "
            "per rollout), else 1."
        ),
    ),
    ("optimization", None),
    ("sampling", None),
    ("multi-turn", "Episodes of model and environment turns (docs/en/multi-turn.md)."),
    ("model and data", None),
    ("placement and backends", None),
    (
        "asynchronous training",
        (
            "with --fully-async the rollout of step t samples with the policy trained up to step "
            "t - 1 - K (K = --max-staleness), so generation overlaps training; K = 0 is the synchronous "
            "schedule exactly. The rollout waits rather than getting more than K versions ahead: no "
            "sample is ever dropped for staleness."
        ),
    ),
    ("outputs", None),
    ("logging", "Trackers, the --no-progress summary line and sample completions (docs/en/tracking.md)."),
    ("evaluation", "Held-out evaluation on the current weights, with the rollout engines (docs/en/evaluation.md)."),
    ("teacher", "The frozen teacher of a method that distills one (docs/en/distillation.md)."),
    (CONFIG_FILE_GROUP, None),
)
# A group a method's own fields name that GROUPS does not (e.g. GDPO's variants) comes after these.



def known_algorithm_spec(text) -> str:
    """A registered algorithm name or a dotted path ``package.module:ClassName`` (loaded later)."""
    text = str(text)
    if text in algorithm_names() or ":" in text:
        return text
    raise argparse.ArgumentTypeError(
        f"unknown advantage estimator {text!r}; choose one of {', '.join(algorithm_names())} or give "
        "a dotted path 'package.module:ClassName' to your own RLAlgorithm subclass"
    )


def _registered_options() -> dict[str, dict]:
    """What a field cannot say because its values are registered above the configuration layer:
    the method names of ``--advantage-estimator``, the backends of ``--backend`` and the engines of
    ``--rollout-engine``."""
    help = flag_of(attrs.fields(RunConfig).advantage_estimator).help
    return {
        "advantage_estimator": {"type": known_algorithm_spec, "help": f"{help}; registered: {', '.join(algorithm_names())}"},
        "backend": {"choices": backend_names()},
        "rollout_engine": {"choices": engine_names()},
    }


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Shows meaningful defaults (not None/False) and keeps the description's line breaks."""

    def _get_help_string(self, action):
        if action.default is None or isinstance(action.default, bool):
            return action.help
        return super()._get_help_string(action)


def method_fields(algorithm: type[RLAlgorithm] | None = None) -> list[attrs.Attribute]:
    """The hyper-parameter fields the parser knows: ``algorithm``'s ``Config`` (default: the default
    method's), then those of the other built-in methods' that it lacks."""
    algorithm = algorithm or load_algorithm(attrs.fields(RunConfig).advantage_estimator.default)
    fields = {f.name: f for f in attrs.fields(algorithm.Config)}
    for cls in BUILTIN_ALGORITHMS:
        for config in (cls.Config, *(p.Config for p in getattr(cls, "PRESETS", {}).values())):
            for field in attrs.fields(config):
                fields.setdefault(field.name, field)
    return list(fields.values())


def config_fields(algorithm: type[RLAlgorithm] | None = None) -> Iterator[attrs.Attribute]:
    """Every field a flag sets: RunConfig's, with the method fields in place of ``algorithm``."""
    for field in attrs.fields(RunConfig):
        if field.name == "algorithm":
            yield from method_fields(algorithm)
        else:
            yield field


def method_of_command_line(argv: list[str]) -> type[RLAlgorithm] | None:
    """Phase one: the class ``--advantage-estimator`` names on the command line, else in the
    ``--config`` file, else None (the default method). ``ValueError`` with the message argparse
    would print when the class does not load (an unreadable file is left to phase two)."""
    early = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    early.add_argument("--advantage-estimator", dest="advantage_estimator", default=None)
    early.add_argument("--config", dest="config", default=None)
    known, _ = early.parse_known_args(argv)
    spec = known.advantage_estimator
    if spec is None and known.config:
        try:
            data = yaml.safe_load(Path(known.config).read_text())
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            data = None
        if isinstance(data, dict):
            spec = next((v for k, v in data.items() if str(k).lstrip("-").replace("-", "_") == "advantage_estimator"), None)
    if spec is None:
        return None
    try:
        known_algorithm_spec(spec)
        return load_algorithm(str(spec))
    except (argparse.ArgumentTypeError, KeyError, ValueError, TypeError) as exc:
        message = exc.args[0] if exc.args else str(exc)
        raise ValueError(f"argument --advantage-estimator: {message}") from None


def _add_flag(group: argparse._ArgumentGroup, field: attrs.Attribute) -> None:
    spec = flag_of(field)
    if isinstance(field.default, bool):  # an on/off switch; a negated name turns True off
        options = {"action": "store_false" if field.default else "store_true"}
    else:
        options = {"type": spec.type, "choices": spec.choices, "metavar": spec.metavar, "nargs": spec.nargs}
    options = {"help": spec.help, **options, **_registered_options().get(field.name, {})}
    group.add_argument(*option_strings(field), dest=field.name, default=flag_default(field), **options)


def add_train_arguments(parser: argparse.ArgumentParser, algorithm: type[RLAlgorithm] | None = None) -> None:
    """Add every ``relax train`` flag of ``algorithm`` (default: the default method) to ``parser``,
    in documented groups."""
    groups = {title: parser.add_argument_group(title, description) for title, description in GROUPS}
    fields = list(config_fields(algorithm))
    for field in fields:
        title = flag_of(field).group
        if title not in groups:
            if field.name in RUN_FIELD_NAMES:
                raise ValueError(f"the flag of {field.name!r} names group {title!r}, which GROUPS does not list")
            groups[title] = parser.add_argument_group(title)  # a method's own group, e.g. GDPO's variants
    for field in fields:
        _add_flag(groups[flag_of(field).group], field)
    groups[CONFIG_FILE_GROUP].add_argument(
        "--config",
        dest="config",
        default=None,
        metavar="FILE.yaml",
        help="YAML mapping of flag -> value (dest names like n_samples_per_prompt or flag names "
        "like n-samples-per-prompt); flags on the command line override it",
    )


def build_train_parser(
    prog: str = "relax train", parser: argparse.ArgumentParser | None = None,
    algorithm: type[RLAlgorithm] | None = None,
):
    """The ``relax train`` parser of ``algorithm``'s flags (or fill ``parser``, e.g. a subparser)."""
    if parser is None:
        parser = argparse.ArgumentParser(prog=prog, formatter_class=HelpFormatter, allow_abbrev=False)
    add_train_arguments(parser, algorithm)
    return parser
