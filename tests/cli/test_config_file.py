"""``--config FILE.yaml``: merge, command-line override, unknown keys, re-validation, the effective file."""

from __future__ import annotations

import sys
import types

import yaml

from relax.config.run import RunConfig


def write(tmp_path, text, name="run.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def dry(cli, *argv):
    code, out, err = cli("train", "--dry-run", *argv)
    return code, (yaml.safe_load(out) if code == 0 else None), err


def test_file_sets_flags_by_dest_and_flag_name(cli, tmp_path):
    path = write(
        tmp_path,
        """
n_samples_per_prompt: 4
--rollout-batch-size: 6
lambd: 0.9
reward-keys: [a, b]
gdpo_reward_weights: [1, 0.5]
disable-rewards-normalization: true
no_progress: true
lr: 1e-5
kl_loss_type: k3
""",
    )
    code, config, err = dry(cli, "--config", path)
    assert code == 0, err
    assert config["n_samples_per_prompt"] == 4 and config["rollout_batch_size"] == 6
    assert config["lam"] == 0.9
    assert config["reward_keys"] == ["a", "b"] and config["reward_weights"] == [1.0, 0.5]
    assert config["rewards_normalization"] is False and config["progress"] is False
    assert config["lr"] == 1e-5  # PyYAML reads 1e-5 as text; the flag's type converts it
    assert config["kl_loss_type"] == "k3"


def test_command_line_overrides_file(cli, tmp_path):
    path = write(tmp_path, "n_samples_per_prompt: 4\nseed: 7\nrewards_normalization: false\n")
    code, config, _ = dry(cli, "--config", path, "--n-samples-per-prompt", 6)
    assert code == 0
    assert config["n_samples_per_prompt"] == 6 and config["seed"] == 7
    assert config["rewards_normalization"] is False


def test_unknown_key_is_an_error_naming_it(cli, tmp_path):
    path = write(tmp_path, "n_samples_per_prompts: 4\n")
    code, out, err = cli("train", "--config", path)
    assert code == 2 and out == ""
    assert "unknown key 'n_samples_per_prompts'" in err and "did you mean 'n_samples_per_prompt'?" in err


def test_bad_values_name_the_key(cli, tmp_path):
    cases = {
        "n_samples_per_prompt: two\n": "key 'n_samples_per_prompt': expected an integer, got 'two'",
        "normalize_advantages: 1\n": "key 'normalize_advantages' must be true or false, got 1",
        "kl_loss_type: k9\n": "key 'kl_loss_type': 'k9' is not one of k1, k2, k3, low_var_kl",
        "eps_clip: [0.1, 0.2]\n": "key 'eps_clip' takes a single value",
        "- a\n- b\n": "must hold a mapping of flag: value",
        "advantage_estimator: nope\n": "unknown advantage estimator 'nope'",
    }
    for text, message in cases.items():
        code, _, err = cli("train", "--config", write(tmp_path, text))
        assert code == 2 and message in err, (text, err)
    code, _, err = cli("train", "--config", tmp_path / "absent.yaml")
    assert code == 2 and "cannot read" in err


def test_validation_runs_after_the_merge(cli, tmp_path, user_module):
    # the file selects a method whose rules the command line alone would not trigger
    path = write(tmp_path, f"advantage_estimator: {user_module}:NeedsNorm\n")
    code, _, err = cli("train", "--dry-run", "--config", path)
    assert code == 2 and "requires advantage normalization: add --normalize-advantages" in err
    assert cli("train", "--dry-run", "--config", path, "--normalize-advantages")[0] == 0
    # and a file value can break a rule too
    path = write(tmp_path, "reward_keys: [only]\n", "multi.yaml")
    code, _, err = cli(
        "train", "--dry-run", "--config", path, "--advantage-estimator", f"{user_module}:MultiReward"
    )
    assert code == 2 and "needs at least two reward keys" in err


def test_train_writes_effective_config_and_calls_runtime(cli, tmp_path, monkeypatch):
    calls = []
    runtime = types.ModuleType("relax.runtime.driver.train")
    runtime.run = calls.append  # stands in for the Ray runtime: nothing starts
    monkeypatch.setitem(sys.modules, "relax.runtime.driver.train", runtime)
    out_dir = tmp_path / "out"
    code, _, err = cli(
        "train",
        "--output-dir",
        out_dir,
        "--n-samples-per-prompt",
        4,
        "--rollout-batch-size",
        8,
        "--reward-keys",
        "a",
        "b",
        "--reward-weights",
        "1",
        "0.25",
        "--run-name",
        "t",
    )
    assert code == 0, err
    (config,) = calls
    assert isinstance(config, RunConfig)
    assert config.global_batch_size == 16 and config.num_steps_per_rollout == 2  # derived, filled in
    assert config.algorithm.reward_keys == ("a", "b") and config.algorithm.reward_weights == (1.0, 0.25)
    written = out_dir / "config.yaml"
    assert written.is_file()
    # the written file repeats the run: reading it back gives the same configuration
    calls.clear()
    code, _, err = cli("train", "--config", written)
    assert code == 0, err
    assert calls == [config]


def test_default_output_dir_uses_run_name(cli):
    code, config, _ = dry(cli, "--run-name", "exp1")
    assert config["run_name"] == "exp1" and config["output_dir"] == "outputs/exp1"
    code, config, _ = dry(cli)
    assert config["run_name"].startswith("grpo-")
