"""The command line takes no abbreviations, suggests the flag a typo meant, and a YAML string given
where a list is expected means what the same words mean on the command line."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


def test_a_prefix_of_a_flag_is_refused_with_a_did_you_mean(cli):
    code, out, err = cli("train", "--dry-run", "--num-roll", 7)
    assert code == 2 and out == ""
    assert "unrecognized arguments: --num-roll 7" in err
    assert "--num-roll: did you mean --num-rollout?" in err


@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("--num-rolout", "--num-rollout"),
        ("--lr-typo=1e-4", "--lr"),
        ("--n-sample-per-prompt", "--n-samples-per-prompt"),
    ],
)
def test_a_mistyped_flag_gets_the_closest_flag(cli, typo, meant):
    code, _, err = cli("train", "--dry-run", typo)
    assert code == 2
    assert f"{typo.split('=')[0]}: did you mean {meant}?" in err


def test_a_flag_like_nothing_known_points_at_help(cli):
    code, _, err = cli("train", "--dry-run", "--xyzzy")
    assert code == 2 and "unrecognized arguments: --xyzzy; see --help for the flags" in err


def test_the_other_commands_refuse_prefixes_too(cli, tmp_path):
    code, _, err = cli("algorithms", "--jso")  # a prefix of --json
    assert code == 2 and "--jso: did you mean --json?" in err


def test_the_flag_and_the_yaml_key_share_one_suggestion_rule(cli, tmp_path):
    from relax.cli.suggest import closest

    assert closest("num_rolout", ["num_rollout", "lr"]) == "num_rollout"
    assert closest("zzz", ["num_rollout", "lr"]) is None
    path = tmp_path / "run.yaml"
    path.write_text("num_rolout: 3\n")
    code, _, err = cli("train", "--dry-run", "--config", path)
    assert code == 2 and "did you mean 'num_rollout'?" in err


@pytest.mark.parametrize("text", ["reward_keys: correct format\n", "reward_keys: 'correct, format'\n"])
def test_a_yaml_string_where_a_list_is_expected_is_split(cli, tmp_path, text):
    path = tmp_path / "run.yaml"
    path.write_text(text + "reward_weights: 1 0.5\n")
    code, out, err = cli("train", "--dry-run", "--config", path)
    assert code == 0, err
    config = yaml.safe_load(out)
    assert config["reward_keys"] == ["correct", "format"] and config["reward_weights"] == [1.0, 0.5]


def _parsers_without_allow_abbrev_false(path: Path) -> list[int]:
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in ("ArgumentParser", "add_parser"):
                given = {k.arg: k.value for k in node.keywords}
                value = given.get("allow_abbrev")
                if not (isinstance(value, ast.Constant) and value.value is False):
                    lines.append(node.lineno)
    return lines


def test_every_parser_in_the_repository_refuses_abbreviations():
    offenders = {}
    for top in ("relax", "benchmarks", "examples"):
        for path in sorted((REPO / top).rglob("*.py")):
            lines = _parsers_without_allow_abbrev_false(path)
            if lines:
                offenders[str(path.relative_to(REPO))] = lines
    assert offenders == {}, f"argument parsers without allow_abbrev=False: {offenders}"
