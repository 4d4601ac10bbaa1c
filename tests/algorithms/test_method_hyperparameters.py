"""A user's method declares its own hyper-parameter on its ``Config`` (docs/en/adding-an-algorithm.md),
and ``relax train`` treats it like a built-in flag: ``--help``, the command line, ``--config`` YAML,
``--dry-run``, ``relax algorithms``, validation, ``--load`` and every process of a run."""

from __future__ import annotations

import json
import os
import sys

import pytest
import yaml

from relax.cli.main import main

MODULE = "relax_user_scaled_grpo"
SPEC = f"{MODULE}:ScaledGRPO"

# The class of the guide, plus a record of the value each stage sees (one line per call, per process).
SOURCE = '''
import json, os
import attrs
import torch
from relax.algorithms import flag, get_algorithm

GRPO = get_algorithm("grpo")
SEEN = {seen!r}  # where each stage writes the value it reads


def _record(stage, value):
    if SEEN:
        with open(os.path.join(SEEN, f"{{stage}}-{{os.getpid()}}.jsonl"), "a") as f:
            f.write(json.dumps(value) + "\\n")


class ScaledGRPO(GRPO):
    """GRPO whose advantages are multiplied by --advantage-scale."""

    @attrs.frozen(kw_only=True)
    class Config(GRPO.Config):
        advantage_scale: float = attrs.field(default=1.0, metadata=flag(
            "multiply every advantage by this", group="algorithm", type=float))

    def compute_advantages(self, inputs, process_group=None):
        _record("advantages", self.config.advantage_scale)
        advantages, returns = super().compute_advantages(inputs, process_group)
        return advantages * self.config.advantage_scale, returns

    def policy_loss(self, inputs):
        _record("policy_loss", self.config.advantage_scale)
        out = super().policy_loss(inputs)
        # a token-weighted share, so that the sum over micro-batches and ranks is the value itself
        mask = inputs.response_mask.to(torch.bool)
        share = mask.sum().to(torch.float64) / inputs.global_num_tokens
        out.metrics["advantage_scale"] = (share * self.config.advantage_scale).to(torch.float32)
        return out

    def reward_diagnostics(self, rewards, group_ids, advantages=None, *, response_mask=None):
        _record("diagnostics", self.config.advantage_scale)
        return super().reward_diagnostics(rewards, group_ids, advantages, response_mask=response_mask)
'''


def _write_module(directory, seen=""):
    (directory / f"{MODULE}.py").write_text(SOURCE.format(seen=str(seen)))
    sys.modules.pop(MODULE, None)


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    _write_module(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    sys.modules.pop(MODULE, None)


def _cli(capsys, *argv):
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def test_the_flag_is_in_help_and_in_relax_algorithms(user_dir, capsys):
    code, out, _ = _cli(capsys, "train", "--advantage-estimator", SPEC, "--help")
    assert code == 0
    assert "--advantage-scale ADVANTAGE_SCALE" in out and "multiply every advantage by this" in " ".join(out.split())
    code, out, _ = _cli(capsys, "algorithms", SPEC)
    assert code == 0 and "--advantage-scale (default: 1.0): multiply every advantage by this" in out
    code, out, _ = _cli(capsys, "algorithms", SPEC, "--json")
    assert json.loads(out)["hyperparameters"]["advantage_scale"] == 1.0
    code, out, _ = _cli(capsys, "train", "--help")  # another method: no such flag
    assert code == 0 and "--advantage-scale" not in out


def test_command_line_and_yaml_reach_the_dry_run(user_dir, capsys):
    code, out, err = _cli(capsys, "train", "--dry-run", "--advantage-estimator", SPEC, "--advantage-scale", "2.5")
    assert code == 0, err
    config = yaml.safe_load(out)
    assert config["advantage_scale"] == 2.5 and config["advantage_estimator"] == SPEC
    assert "does not read" not in err  # the method's own field counts as read by it
    path = user_dir / "run.yaml"
    path.write_text(f"advantage_estimator: {SPEC}\nadvantage-scale: 2.5\n")
    code, out, err = _cli(capsys, "train", "--dry-run", "--config", path)
    assert code == 0, err
    assert yaml.safe_load(out)["advantage_scale"] == 2.5
    code, out, err = _cli(capsys, "train", "--dry-run", "--config", path, "--advantage-scale", "3")
    assert code == 0 and yaml.safe_load(out)["advantage_scale"] == 3.0  # the command line wins


def test_bad_values_and_the_wrong_method_are_refused(user_dir, capsys):
    code, _, err = _cli(capsys, "train", "--dry-run", "--advantage-estimator", SPEC, "--advantage-scale", "big")
    assert code == 2 and "argument --advantage-scale: invalid float value: 'big'" in err
    code, _, err = _cli(capsys, "train", "--dry-run", "--advantage-scale", "2.5")  # GRPO has no such flag
    assert code == 2 and "unrecognized arguments: --advantage-scale 2.5" in err
    code, _, err = _cli(capsys, "train", "--dry-run", "--advantage-estimator", f"{MODULE}:Nope", "--advantage-scale", "2")
    assert code == 2 and "argument --advantage-estimator:" in err and "Nope" in err


def test_load_compares_the_methods_own_field(user_dir):
    from relax.algorithms import load_algorithm
    from relax.config.run import RunConfig
    from relax.runtime.files.checkpoint_files import algorithm_settings

    cls = load_algorithm(SPEC)
    config = RunConfig(advantage_estimator=SPEC, algorithm=cls.Config(advantage_scale=2.5))
    assert algorithm_settings(config)["advantage_scale"] == 2.5  # what a checkpoint stores and --load diffs


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_every_process_of_a_run_sees_the_value(ray_cluster, tmp_path, monkeypatch, capsys):
    # The module sits in the directory every Ray worker imports from; each stage records the value.
    seen = tmp_path / "seen"
    seen.mkdir()
    _write_module(ray_cluster, seen)
    monkeypatch.syspath_prepend(str(ray_cluster))
    monkeypatch.chdir(ray_cluster)
    out = tmp_path / "run"
    code, _, err = _cli(
        capsys, "train", "--advantage-estimator", SPEC, "--advantage-scale", "2.5", "--num-rollout", 2,
        "--rollout-batch-size", 4, "--n-samples-per-prompt", 4, "--seed", 3, "--no-eval", "--no-progress",
        "--output-dir", out,
    )
    sys.modules.pop(MODULE, None)
    assert code == 0, err
    records = {}
    for path in seen.iterdir():
        stage, pid = path.stem.split("-")
        records.setdefault(stage, {})[int(pid)] = [json.loads(line) for line in path.read_text().splitlines()]
    assert set(records) == {"advantages", "policy_loss", "diagnostics"}, records
    for stage, by_pid in records.items():
        assert all(v == 2.5 for values in by_pid.values() for v in values), (stage, by_pid)
    # the advantages deployment and the actor are processes of their own, not the driver
    assert os.getpid() not in records["advantages"] and os.getpid() not in records["policy_loss"]
    assert sum(len(v) for v in records["advantages"].values()) == 2  # one batch per step
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["step"] > 0]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["actor/advantage_scale"] == pytest.approx(2.5, rel=1e-5) for r in rows), rows
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["advantage_scale"] == 2.5 and saved["advantage_estimator"] == SPEC
