"""The ``relax train`` argument parser, generated from the configuration fields.

Every ``RunConfig`` / ``AlgorithmConfig`` field declares its flag in attrs metadata
(``relax.algorithms.flags.flag``): help text, ``--help`` group, value parser, choices, and the option
strings where they differ from the field name (upstream Relax spellings such as ``--lambd``).
Flag names and defaults follow upstream Relax where it has the flag. A flag's ``dest`` is the field
it sets, so a ``--config`` file may use either the dest or the flag name. This module adds only what
no field can say: the groups' order and descriptions, ``--config`` and the help formatter.

Nothing here imports ray: ``relax train --help`` and validation run without it.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import attrs

from relax.algorithms import algorithm_names
from relax.algorithms.config import GDPO_GROUP, AlgorithmConfig
from relax.algorithms.flags import flag_default, flag_of, option_strings
from relax.backends.registry import backend_names
from relax.config.run import RunConfig

CONFIG_FILE_GROUP = "configuration file"

# The --help groups, in order: (title, description). A field's flag names its group by title.
GROUPS = (
    ("algorithm", "Which RL method runs, and its hyper-parameters."),
    ("rewards", "Reward components and reward hooks."),
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
    (CONFIG_FILE_GROUP, None),
    (GDPO_GROUP, None),
)


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
    the method names of ``--advantage-estimator`` and the backends of ``--backend``."""
    return {
        "advantage_estimator": {"type": known_algorithm_spec},
        "backend": {"choices": backend_names()},
    }


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Shows meaningful defaults (not None/False) and keeps the description's line breaks."""

    def _get_help_string(self, action):
        if action.default is None or isinstance(action.default, bool):
            return action.help
        return super()._get_help_string(action)


def config_fields() -> Iterator[attrs.Attribute]:
    """Every field a flag sets: RunConfig's, with AlgorithmConfig's in place of ``algorithm``."""
    for field in attrs.fields(RunConfig):
        if field.name == "algorithm":
            yield from attrs.fields(AlgorithmConfig)
        else:
            yield field


def _add_flag(group: argparse._ArgumentGroup, field: attrs.Attribute) -> None:
    spec = flag_of(field)
    if isinstance(field.default, bool):  # an on/off switch; a negated name turns True off
        options = {"action": "store_false" if field.default else "store_true"}
    else:
        options = {"type": spec.type, "choices": spec.choices, "metavar": spec.metavar, "nargs": spec.nargs}
        options.update(_registered_options().get(field.name, {}))
    group.add_argument(
        *option_strings(field), dest=field.name, default=flag_default(field), help=spec.help, **options
    )


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every ``relax train`` flag to ``parser``, in documented groups."""
    groups = {title: parser.add_argument_group(title, description) for title, description in GROUPS}
    for field in config_fields():
        title = flag_of(field).group
        if title not in groups:
            raise ValueError(f"the flag of {field.name!r} names group {title!r}, which GROUPS does not list")
        _add_flag(groups[title], field)
    groups[CONFIG_FILE_GROUP].add_argument(
        "--config",
        dest="config",
        default=None,
        metavar="FILE.yaml",
        help="YAML mapping of flag -> value (dest names like n_samples_per_prompt or flag names "
        "like n-samples-per-prompt); flags on the command line override it",
    )


def build_train_parser(prog: str = "relax train", parser: argparse.ArgumentParser | None = None):
    """The ``relax train`` parser (or fill ``parser``, e.g. a subparser)."""
    if parser is None:
        parser = argparse.ArgumentParser(prog=prog, formatter_class=HelpFormatter, allow_abbrev=False)
    add_train_arguments(parser)
    return parser
