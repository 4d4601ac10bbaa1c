"""``relax train --load RUN_DIR`` alone resumes with the run's own ``config.yaml`` as the base; flags
given with it override the file. (Pre-flight still refuses a change that breaks the resume:
``check_checkpoint``'s tests; the end-to-end resume: tests/cli/test_signals.py.)"""

from __future__ import annotations

import attrs
import yaml

from relax.cli.config_file import write_effective_config
from relax.config.run import RunConfig


def _run_dir(tmp_path, **settings):
    """A run directory as relax leaves it: config.yaml and a checkpoint (its content is not read
    here: pre-flight, which reads it, is off in these tests)."""
    run = tmp_path / "run"
    config = RunConfig(output_dir=str(run))
    config = attrs.evolve(config, **settings)
    write_effective_config(config)
    (run / "checkpoints" / "step_000002").mkdir(parents=True)
    (run / "checkpoints" / "step_000002" / "state.pt").write_bytes(b"not read")
    return run


def dry(cli, *argv):
    code, out, err = cli("train", "--dry-run", *argv)
    return code, (yaml.safe_load(out) if code == 0 else None), err


def test_load_alone_takes_the_runs_settings(cli, tmp_path):
    run = _run_dir(tmp_path, num_rollout=7, seed=3, lr=2e-4)
    code, config, err = dry(cli, "--load", run)
    assert code == 0, err
    assert config["num_rollout"] == 7 and config["seed"] == 3 and config["lr"] == 2e-4
    assert config["output_dir"] == str(run) and config["load"] == str(run)
    assert f"resuming with the settings in {run / 'config.yaml'}" in err


def test_flags_given_with_load_override_the_runs_settings(cli, tmp_path):
    run = _run_dir(tmp_path, num_rollout=7, seed=3)
    code, config, err = dry(cli, "--load", run, "--num-rollout", 12)
    assert code == 0, err
    assert config["num_rollout"] == 12 and config["seed"] == 3


def test_load_of_one_checkpoint_of_the_run_also_takes_its_settings(cli, tmp_path):
    run = _run_dir(tmp_path, seed=5)
    code, config, err = dry(cli, "--load", run / "checkpoints" / "step_000002")
    assert code == 0, err
    assert config["seed"] == 5


def test_an_explicit_config_stays_the_base(cli, tmp_path):
    run = _run_dir(tmp_path, seed=5)
    other = tmp_path / "other.yaml"
    other.write_text("seed: 9\n")
    code, config, err = dry(cli, "--load", run, "--config", other)
    assert code == 0, err
    assert config["seed"] == 9 and "resuming with the settings" not in err


def test_a_run_config_that_no_longer_parses_names_load_and_the_file(cli, tmp_path):
    run = _run_dir(tmp_path)
    (run / "config.yaml").write_text((run / "config.yaml").read_text() + "retired_flag: 1\n")
    code, _, err = dry(cli, "--load", run)
    assert code == 2
    assert f"--load {run}: the run's settings {run / 'config.yaml'}: unknown key 'retired_flag'" in err


def test_load_alone_resumes_a_run_of_another_method_with_its_own_flags(cli, tmp_path):
    from relax.algorithms import load_algorithm

    gdpo = load_algorithm("gdpo")
    run = tmp_path / "run"
    config = RunConfig(advantage_estimator="gdpo", output_dir=str(run), seed=4,
                       algorithm=gdpo.Config(reward_keys=("correct", "format"), gdpo_baseline="leave_one_out"))
    write_effective_config(config)
    (run / "checkpoints" / "step_000002").mkdir(parents=True)
    (run / "checkpoints" / "step_000002" / "state.pt").write_bytes(b"not read")
    code, out, err = dry(cli, "--load", run)
    assert code == 0, err
    assert out["advantage_estimator"] == "gdpo" and out["seed"] == 4
    assert out["reward_keys"] == ["correct", "format"] and out["gdpo_baseline"] == "leave_one_out"
    assert "warning" not in err  # GDPO's own keys are GDPO's flags here, not another method's


USER_METHOD = """
import attrs

from relax.algorithms.grpo import GRPO
from relax.config.fields import flag


class Scaled(GRPO):
    @attrs.frozen(kw_only=True)
    class Config(GRPO.Config):
        scaled_factor: float = attrs.field(default=1.0, metadata=flag("reward scale", group="algorithm", type=float))
"""


def test_load_alone_finds_a_user_methods_own_flags(cli, tmp_path, monkeypatch):
    (tmp_path / "relax_resume_user_method.py").write_text(USER_METHOD)
    monkeypatch.syspath_prepend(str(tmp_path))
    from relax.algorithms import load_algorithm

    method = load_algorithm("relax_resume_user_method:Scaled")
    run = tmp_path / "run"
    write_effective_config(RunConfig(advantage_estimator="relax_resume_user_method:Scaled", output_dir=str(run),
                                     algorithm=method.Config(scaled_factor=3.0)))
    (run / "checkpoints" / "step_000002").mkdir(parents=True)
    (run / "checkpoints" / "step_000002" / "state.pt").write_bytes(b"not read")
    code, out, err = dry(cli, "--load", run)
    assert code == 0, err
    assert out["advantage_estimator"] == "relax_resume_user_method:Scaled" and out["scaled_factor"] == 3.0
