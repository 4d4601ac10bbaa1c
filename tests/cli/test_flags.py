"""Each flag is declared once, on its configuration field; the parser and every message agree with it."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import attrs
import pytest
import yaml

from relax.algorithms import BUILTIN_ALGORITHMS
from relax.cli.arguments import _registered_options, add_train_arguments, build_train_parser, config_fields
from relax.config.algorithm import AlgorithmConfig
from relax.config.fields import flag, flag_name, flag_of, option_strings
from relax.config.output_dir import default_run_name, output_dir_of
from relax.config.run import RunConfig

# Flags of the command line itself, not of a configuration field.
COMMAND_FLAGS = {"help", "config"}


def _field_actions():
    return [a for a in build_train_parser()._actions if a.dest not in COMMAND_FLAGS]


def test_every_field_has_exactly_one_flag_and_every_flag_sets_a_field():
    fields = {f.name for f in config_fields()}
    methods = set().union(*(attrs.fields_dict(cls.Config) for cls in BUILTIN_ALGORITHMS))
    declared = methods | set(attrs.fields_dict(RunConfig)) - {"algorithm"}
    assert set(attrs.fields_dict(AlgorithmConfig)) < methods  # every method's Config holds the shared fields
    assert fields == declared
    dests = [a.dest for a in _field_actions()]
    assert sorted(dests) == sorted(fields)


def test_the_parser_is_what_the_fields_declare():
    actions = {a.dest: a for a in _field_actions()}
    for field in config_fields():
        spec, action = flag_of(field), actions[field.name]
        registered = _registered_options().get(field.name, {})  # names registered above config
        assert spec.help and action.help == registered.get("help", spec.help), field.name
        assert tuple(action.option_strings) == option_strings(field)
        assert action.option_strings[0] == flag_name(field)
        if not isinstance(field.default, bool):
            expected = {"type": spec.type, "choices": spec.choices, "nargs": spec.nargs}
            expected.update({k: v for k, v in registered.items() if k in expected})
            assert (action.type, action.choices, action.nargs) == tuple(expected.values()), field.name


def test_registered_names_are_the_choices_of_their_flags():
    from relax.algorithms import algorithm_names
    from relax.backends.registry import backend_names

    actions = {a.dest: a for a in _field_actions()}
    assert actions["backend"].choices == backend_names()
    for name in algorithm_names():
        assert actions["advantage_estimator"].type(name) == name
    with pytest.raises(argparse.ArgumentTypeError, match="unknown advantage estimator 'nope'"):
        actions["advantage_estimator"].type("nope")


def test_flag_defaults_are_the_field_defaults_except_derived_reward_keys():
    actions = {a.dest: a for a in _field_actions()}
    differ = {f.name for f in config_fields() if actions[f.name].default != f.default}
    assert differ == {"reward_keys"}  # the command line derives them from the task or the data
    assert actions["reward_keys"].default is None


def test_upstream_spellings_and_negated_switches():
    fields = {f.name: f for f in config_fields()}
    renamed = {name for name, f in fields.items() if option_strings(f) != ("--" + name.replace("_", "-"),)}
    assert renamed == {
        "lam", "reward_keys", "reward_weights", "grpo_std_normalization", "rewards_normalization", "progress",
        "evaluate", "eval_before_train",
    }
    assert flag_name(fields["evaluate"]) == "--no-eval"
    assert flag_name(fields["eval_before_train"]) == "--no-eval-before-train"
    ns = build_train_parser().parse_args(["--no-eval-before-train"])
    assert (ns.evaluate, ns.eval_before_train) == (True, False)
    assert option_strings(fields["lam"]) == ("--lambd", "--lam")
    assert option_strings(fields["reward_keys"]) == ("--reward-keys", "--gdpo-reward-keys")
    assert flag_name(fields["rewards_normalization"]) == "--disable-rewards-normalization"
    assert flag_name(fields["grpo_std_normalization"]) == "--disable-grpo-std-normalization"
    assert flag_name(fields["progress"]) == "--no-progress"
    argv = ["--disable-rewards-normalization", "--no-progress", "--use-kl-loss"]
    ns = build_train_parser().parse_args(argv)
    switches = (ns.rewards_normalization, ns.progress, ns.use_kl_loss, ns.normalize_advantages)
    assert switches == (False, False, True, False)


def test_help_lists_every_field_flag(cli):
    code, out, _ = cli("train", "--help")
    assert code == 0
    for field in config_fields():
        for option in option_strings(field):
            assert re.search(rf"(^|[\s,]){re.escape(option)}\b", out, re.MULTILINE), option


def test_a_field_without_a_flag_or_in_an_unknown_group_is_reported(monkeypatch):
    @attrs.frozen
    class Stray:
        x: int = attrs.field(default=1, metadata=flag("x", group="no such group"))
        y: int = 2

    with pytest.raises(TypeError, match="'y' declares no flag"):
        flag_name(attrs.fields(Stray).y)
    # a run field must name one of the documented groups; a method's own field may bring its own
    monkeypatch.setattr("relax.cli.arguments.config_fields", lambda algorithm=None: iter(attrs.fields(Stray)))
    monkeypatch.setattr("relax.cli.arguments.RUN_FIELD_NAMES", {"x"})
    with pytest.raises(ValueError, match="names group 'no such group'"):
        add_train_arguments(argparse.ArgumentParser())
    monkeypatch.setattr("relax.cli.arguments.RUN_FIELD_NAMES", set())
    with pytest.raises(TypeError, match="'y' declares no flag"):  # x got its own group; y has no flag
        add_train_arguments(argparse.ArgumentParser())


def test_run_name_and_output_dir():
    assert re.fullmatch(r"grpo-\d{8}-\d{6}", default_run_name("grpo"))
    assert re.fullmatch(r"MyAlgo-\d{8}-\d{6}", default_run_name("my_pkg.algos:MyAlgo"))
    assert output_dir_of(RunConfig(output_dir="somewhere")) == Path("somewhere")
    assert output_dir_of(RunConfig(run_name="exp")) == Path("outputs/exp")
    unnamed = output_dir_of(RunConfig(advantage_estimator="gdpo")).as_posix()
    assert re.fullmatch(r"outputs/gdpo-\d{8}-\d{6}", unnamed)


def test_cli_records_run_name_and_output_dir(cli):
    code, out, err = cli("train", "--dry-run", "--advantage-estimator", "rloo")
    assert code == 0, err
    config = yaml.safe_load(out)
    assert re.fullmatch(r"rloo-\d{8}-\d{6}", config["run_name"])
    assert config["output_dir"] == f"outputs/{config['run_name']}"
    code, out, _ = cli("train", "--dry-run", "--output-dir", "./mine/", "--run-name", "r")
    assert yaml.safe_load(out)["output_dir"] == "./mine/"  # kept as given
