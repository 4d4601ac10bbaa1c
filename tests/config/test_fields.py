"""One rule object per field: it is the flag's parser and the check of a value set in Python."""

from __future__ import annotations

import argparse
import re

import attrs
import pytest

from relax.config.fields import POSITIVE_INT, OneOf, Range, field_problems, flag, flag_of


@pytest.mark.parametrize(
    "rule, good, bad, requirement",
    [
        (Range(gt=0), "0.5", "0", "> 0"),
        (Range(ge=0), "0", "-1e-9", ">= 0"),
        (Range(ge=0, le=1), "1", "1.5", "in [0, 1]"),
        (Range(gt=0, le=1), "1", "0", "in (0, 1]"),
        (Range(ge=0, lt=1), "0", "1", "in [0, 1)"),
        (Range(ge=1, integer=True), "3", "0", ">= 1"),
    ],
)
def test_the_parser_and_the_check_state_the_same_bounds(rule, good, bad, requirement):
    assert rule.parse(good) == (int if rule.integer else float)(good)
    with pytest.raises(argparse.ArgumentTypeError, match=re.escape(f"must be {requirement}, got '{bad}'")):
        rule.parse(bad)
    value = (int if rule.integer else float)(bad)
    assert rule.problem(value) == f"must be {requirement}" and rule.problem(rule.parse(good)) is None


def test_non_numbers_and_non_finite_values():
    with pytest.raises(argparse.ArgumentTypeError, match="must be finite, got 'nan'"):
        Range().parse("nan")
    with pytest.raises(argparse.ArgumentTypeError, match="expected an integer, got '1.5'"):
        POSITIVE_INT.parse("1.5")
    assert Range().problem(float("inf")) == "must be finite"
    assert Range(gt=0).problem("1") == "must be finite and > 0"
    assert POSITIVE_INT.problem(True) == "must be an integer >= 1"  # a bool is not a count
    assert OneOf(("a", "b")).problem("c") == "must be one of a, b"


def test_flag_takes_its_parser_or_choices_from_the_rule():
    assert flag_of_field(flag("x", group="g", check=Range(gt=0))).type == Range(gt=0)
    spec = flag_of_field(flag("x", group="g", check=OneOf(("a", "b"))))
    assert spec.choices == ("a", "b") and spec.type is None


def flag_of_field(metadata):
    @attrs.frozen
    class One:
        x: object = attrs.field(default=None, metadata=metadata)

    return flag_of(attrs.fields(One).x)


def test_field_problems_skips_unset_fields_and_checks_each_list_item():
    @attrs.frozen
    class Settings:
        rate: float = attrs.field(default=1.0, metadata=flag("r", group="g", check=Range(gt=0)))
        limit: int | None = attrs.field(default=None, metadata=flag("l", group="g", check=POSITIVE_INT))
        weights: tuple = attrs.field(default=(1.0,), metadata=flag("w", group="g", nargs="+", check=Range()))
        name: str = attrs.field(default="x")  # no flag: not checked here

    assert list(field_problems(Settings())) == []
    found = {(f.name, p) for f, _, p in field_problems(Settings(rate=0.0, weights=(1.0, float("nan"))))}
    assert found == {("rate", "must be > 0"), ("weights", "must be finite")}
    assert [f.name for f, _, _ in field_problems(Settings(limit=0))] == ["limit"]


def test_a_run_config_built_in_python_is_refused_naming_the_flag():
    from relax.algorithms import get_algorithm
    from relax.config.run import RunConfig
    from relax.runtime.checks.validation import ConfigError, validate

    config = RunConfig(lr=-1.0, rollout_top_p=0.0, algorithm=get_algorithm("grpo").Config(reward_keys=("a",)))
    with pytest.raises(ConfigError) as info:
        validate(config, get_algorithm("grpo"))
    assert "argument --lr: -1.0 is out of range; it must be > 0" in info.value.errors
    assert "argument --rollout-top-p: 0.0 is out of range; it must be in (0, 1]" in info.value.errors
