"""Every capability rule: triggered through ``relax train`` in-process, exit status 2, message checked.

Rules are exercised with user classes (``conftest.USER_SOURCE``) that each declare one capability,
loaded by dotted path; ``test_user_copy_matches_builtin`` shows built-in classes get the same checks.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

import relax.backends.megatron.rules as megatron_pkg
import relax.runtime.checks.validation as validation
from relax.algorithms import BUILTIN_ALGORITHMS, algorithm_names, get_algorithm
from relax.models.tiny.weights import CHECKPOINT as TINY_CHECKPOINT


def spec(user_module, cls):
    return f"{user_module}:{cls}"


def dry(cli, *argv):
    """Validate and return (code, effective config dict or None, stderr)."""
    code, out, err = cli("train", "--dry-run", *argv)
    return code, (yaml.safe_load(out) if code == 0 else None), err


def rejected(cli, *argv) -> str:
    code, out, err = cli("train", "--dry-run", *argv)
    assert code == 2, f"expected exit 2, got {code}; stderr: {err}"
    assert out == ""
    assert "relax train: error:" in err
    return err


# -- the headline case, with the real built-in class ------------------------------------


def test_gdpo_with_one_reward_key_is_rejected_with_example(cli):
    err = rejected(cli, "--advantage-estimator", "gdpo", "--reward-keys", "correctness")
    assert "GDPO (--advantage-estimator gdpo) needs at least two reward keys" in err
    assert "pass e.g. --reward-keys correctness" in err


def test_valid_default_configuration_passes(cli):
    code, config, err = dry(cli)
    assert code == 0, err
    assert config["advantage_estimator"] == "grpo"
    assert config["n_samples_per_prompt"] == 8 and config["rollout_batch_size"] == 32
    assert config["reward_keys"] == ["correct", "format"]  # from the built-in task (fixture)


# -- one test per rule ----------------------------------------------------------------------------


def test_required_advantage_normalization(cli, user_module):
    err = rejected(cli, "--advantage-estimator", spec(user_module, "NeedsNorm"))
    assert (
        "NeedsNorm (--advantage-estimator relax_cli_test_user_algos:NeedsNorm) requires advantage "
        "normalization: add --normalize-advantages" in err
    )
    assert dry(cli, "--advantage-estimator", spec(user_module, "NeedsNorm"), "--normalize-advantages")[0] == 0


def test_forbidden_advantage_normalization(cli, user_module):
    err = rejected(cli, "--advantage-estimator", spec(user_module, "ForbidsNorm"), "--normalize-advantages")
    assert "is incompatible with --normalize-advantages" in err and "Remove --normalize-advantages" in err
    assert dry(cli, "--advantage-estimator", spec(user_module, "ForbidsNorm"))[0] == 0


def test_min_group_size(cli, user_module):
    err = rejected(cli, "--advantage-estimator", spec(user_module, "MinGroup4"), "--n-samples-per-prompt", 2)
    assert "requires --n-samples-per-prompt >= 4 (got 2)" in err
    assert (
        dry(cli, "--advantage-estimator", spec(user_module, "MinGroup4"), "--n-samples-per-prompt", 4)[0] == 0
    )


def test_group_relative_needs_two_samples(cli, user_module):
    err = rejected(
        cli, "--advantage-estimator", spec(user_module, "GroupRelative"), "--n-samples-per-prompt", 1
    )
    assert "with --n-samples-per-prompt 1 every group carries no signal" in err
    assert dry(cli, "--advantage-estimator", spec(user_module, "Plain"), "--n-samples-per-prompt", 1)[0] == 0


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--reward-keys", "correctness"], "needs at least two reward keys"),
        (["--reward-keys", "a", "a"], "lists 'a' more than once"),
        (
            ["--reward-keys", "a", "b", "--reward-weights", "1"],
            "argument --reward-weights: reward_weights has 1 value(s) but reward_keys has 2",
        ),
        (
            ["--reward-keys", "a", "b", "--reward-weights", "nan", "1"],
            "argument --reward-weights/--gdpo-reward-weights: must be finite, got 'nan'",
        ),
        (
            ["--reward-keys", "a", "b", "--reward-weights", "0", "0"],
            "--reward-weights are all zero (0.0 0.0)",
        ),
        (["--reward-keys", "a", "b", "--reward-weights", "1e39", "1"], "overflow float32"),
        (["--reward-keys", "a", "b", "--reward-weights", "1e-50", "1e-50"], "all zero once cast to float32"),
        (
            ["--reward-keys", "a", "b", "--reward-key", "score"],
            "--reward-key score is not one of the reward keys (a b)",
        ),
    ],
)
def test_reward_component_rules(cli, user_module, argv, message):
    err = rejected(cli, "--advantage-estimator", spec(user_module, "MultiReward"), *argv)
    assert message in err


def test_reward_components_example_and_duplicates(cli, user_module):
    err = rejected(cli, "--advantage-estimator", spec(user_module, "MultiReward"), "--reward-keys", "x", "x")
    assert "needs at least two reward keys" in err and "got 1 (x)" in err
    assert "pass e.g. --reward-keys x correctness format" in err
    code, config, _ = dry(
        cli,
        "--advantage-estimator",
        spec(user_module, "MultiReward"),
        "--gdpo-reward-keys",
        "a",
        "b",
        "--gdpo-reward-weights",
        "2",
        "0.5",
        "--reward-key",
        "b",
    )
    assert code == 0
    assert config["reward_keys"] == ["a", "b"] and config["reward_weights"] == [2.0, 0.5]


def test_single_reward_method_accepts_one_key_but_checks_reward_key(cli, user_module):
    assert dry(cli, "--advantage-estimator", spec(user_module, "Plain"), "--reward-keys", "only")[0] == 0
    err = rejected(cli, "--advantage-estimator", spec(user_module, "Plain"), "--reward-key", "nope")
    assert "--reward-key nope is not one of the reward keys (correct format)" in err


def test_rewards_normalization_required(cli, user_module):
    err = rejected(
        cli, "--advantage-estimator", spec(user_module, "NeedsRewardNorm"), "--disable-rewards-normalization"
    )
    assert "requires rewards normalization" in err and "remove --disable-rewards-normalization" in err
    assert (
        dry(cli, "--advantage-estimator", spec(user_module, "Plain"), "--disable-rewards-normalization")[0]
        == 0
    )


def test_reward_post_process_hook_forbidden(cli, user_module):
    hook = spec(user_module, "hook")
    err = rejected(
        cli, "--advantage-estimator", spec(user_module, "NoHooks"), "--custom-reward-post-process-path", hook
    )
    assert "would silently skip NoHooks" in err and "remove --custom-reward-post-process-path" in err
    assert (
        dry(
            cli,
            "--advantage-estimator",
            spec(user_module, "Plain"),
            "--custom-reward-post-process-path",
            hook,
        )[0]
        == 0
    )


def test_reward_side_kl_forbidden(cli, user_module):
    err = rejected(cli, "--advantage-estimator", spec(user_module, "NoRewardKL"), "--kl-coef", "0.1")
    assert "does not support a nonzero --kl-coef (got 0.1)" in err and "Set --kl-coef 0" in err
    assert (
        dry(
            cli,
            "--advantage-estimator",
            spec(user_module, "NoRewardKL"),
            "--use-kl-loss",
            "--kl-loss-coef",
            "0.01",
        )[0]
        == 0
    )


def test_global_token_loss_required(cli, user_module):
    err = rejected(
        cli,
        "--advantage-estimator",
        spec(user_module, "TokenLoss"),
        "--loss-aggregation",
        "seq_mean_token_mean",
    )
    assert "use --loss-aggregation token_mean (got seq_mean_token_mean)" in err


def test_on_policy_updates(cli, user_module):
    on_policy = spec(user_module, "OnPolicy")
    err = rejected(cli, "--advantage-estimator", on_policy, "--num-steps-per-rollout", 2)
    assert (
        "requires exactly one optimizer step per rollout" in err
        and "--num-steps-per-rollout 1 (got 2)" in err
    )
    err = rejected(cli, "--advantage-estimator", on_policy, "--global-batch-size", 64)
    assert (
        "--global-batch-size must equal --rollout-batch-size x --n-samples-per-prompt = 32 x 8 = 256 (got 64)"
        in err
    )
    code, config, _ = dry(cli, "--advantage-estimator", on_policy)
    assert code == 0 and config["num_steps_per_rollout"] == 1 and config["global_batch_size"] == 256


def test_default_mini_batches(cli, user_module):
    code, config, _ = dry(cli, "--advantage-estimator", spec(user_module, "Plain"))
    assert (config["num_steps_per_rollout"], config["global_batch_size"]) == (2, 128)
    # an odd number of prompts cannot be split into two halves of whole groups: one step
    code, config, _ = dry(cli, "--rollout-batch-size", 3, "--n-samples-per-prompt", 4)
    assert (config["num_steps_per_rollout"], config["global_batch_size"]) == (1, 12)
    code, config, _ = dry(cli, "--num-steps-per-rollout", 4)
    assert config["global_batch_size"] == 64
    code, config, _ = dry(cli, "--global-batch-size", 32)
    assert config["num_steps_per_rollout"] == 8


def test_dynamic_filter_with_multi_reward_warns(cli, user_module):
    code, out, err = cli(
        "train",
        "--dry-run",
        "--advantage-estimator",
        spec(user_module, "MultiReward"),
        "--dynamic-sampling-filter-path",
        spec(user_module, "hook"),
    )
    assert code == 0
    assert "relax train: warning: --dynamic-sampling-filter-path" in err and "every reward key" in err
    code, out, err = cli("train", "--dry-run", "--dynamic-sampling-filter-path", spec(user_module, "hook"))
    assert code == 0 and "warning" not in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--global-batch-size", 12],
            "--global-batch-size 12 does not divide the "
            "--rollout-batch-size 32 x --n-samples-per-prompt 8 = 256",
        ),
        (
            ["--rollout-batch-size", 4, "--global-batch-size", 4],
            "must hold whole prompt groups of --n-samples-per-prompt 8",
        ),
        (["--num-steps-per-rollout", 3], "--num-steps-per-rollout 3 does not divide"),
        (
            ["--global-batch-size", 64, "--num-steps-per-rollout", 2],
            "64 x --num-steps-per-rollout 2 = 128 must equal",
        ),
        (["--micro-batch-size", 48], "--micro-batch-size 48 must divide each worker's mini-batch of 128"),
        (["--actor-num-workers", 3], "cannot be split evenly over 3 data-parallel worker(s)"),
    ],
)
def test_batch_arithmetic(cli, argv, message):
    assert message in rejected(cli, *argv)


def test_batch_arithmetic_suggests_valid_sizes(cli):
    err = rejected(cli, "--rollout-batch-size", 4, "--global-batch-size", 12)
    assert "use one of 32, 16, 8" in err


def test_kl_coef_and_kl_loss_coef_not_both(cli):
    err = rejected(cli, "--kl-coef", "0.1", "--use-kl-loss", "--kl-loss-coef", "0.01")
    assert "Only one of --kl-coef (0.1) and --kl-loss-coef (0.01) can be set" in err


def test_kl_loss_coef_without_use_kl_loss_warns(cli):
    code, _, err = cli("train", "--dry-run", "--kl-loss-coef", "0.01")
    assert code == 0 and "--kl-loss-coef 0.01 has no effect without --use-kl-loss" in err


def test_megatron_backend_without_megatron_core(cli, monkeypatch):
    monkeypatch.setattr(megatron_pkg, "megatron_installed", lambda: False)
    err = rejected(cli, "--backend", "megatron")
    assert (
        "--backend megatron needs megatron-core, which is not installed: pip install 'relax-rl[megatron]'"
        in err
    )
    monkeypatch.setattr(megatron_pkg, "megatron_installed", lambda: True)
    assert dry(cli, "--backend", "megatron")[0] == 0
    err = rejected(cli, "--backend", "megatron", "--actor-num-workers", 3, "--tensor-model-parallel-size", 2)
    assert "--actor-num-workers 3 must be a multiple of --tensor-model-parallel-size 2" in err


def test_megatron_detection_never_imports_it(monkeypatch):
    import importlib.util
    import sys

    was_imported = "megatron" in sys.modules
    result = megatron_pkg.megatron_installed()
    assert isinstance(result, bool)
    assert ("megatron" in sys.modules) == was_imported
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert megatron_pkg.megatron_installed() is False


def test_model_parallel_needs_megatron(cli):
    err = rejected(cli, "--tensor-model-parallel-size", 2)
    assert "need --backend megatron" in err


def test_several_errors_are_reported_together(cli, user_module):
    err = rejected(cli, "--advantage-estimator", spec(user_module, "NeedsNorm"), "--global-batch-size", 12)
    assert "invalid configuration:" in err
    assert "add --normalize-advantages" in err and "--global-batch-size 12 does not divide" in err


# -- resolution errors (before the rules) ---------------------------------------------------------


def test_unknown_estimator_lists_names(cli):
    err = rejected(cli, "--advantage-estimator", "nope")
    assert "argument --advantage-estimator: unknown advantage estimator 'nope'" in err
    assert "gdpo" in err


def test_bad_dotted_estimator(cli, user_module):
    err = rejected(cli, "--advantage-estimator", "no_such_module_xyz:Algo")
    assert "argument --advantage-estimator: Cannot import module 'no_such_module_xyz'" in err
    err = rejected(cli, "--advantage-estimator", spec(user_module, "hook"))
    assert "not a subclass of relax.algorithms.RLAlgorithm" in err


def test_algorithm_config_errors_name_the_flag(cli):
    err = rejected(cli, "--eps-clip-c", "0.5")
    assert "argument --eps-clip-c: eps_clip_c (dual clip) must be > 1.0" in err
    assert "argument --gamma: must be in [0, 1]" in rejected(cli, "--gamma", "1.5")


def test_hook_paths_are_imported_before_start(cli):
    err = rejected(cli, "--custom-rm-path", "no_such_module_xyz:score")
    assert "--custom-rm-path 'no_such_module_xyz:score': cannot import module 'no_such_module_xyz'" in err
    err = rejected(cli, "--dynamic-sampling-filter-path", "nocolon")
    assert "--dynamic-sampling-filter-path 'nocolon' is malformed" in err


def test_missing_paths(cli, tmp_path):
    err = rejected(cli, "--prompt-data", tmp_path / "missing.jsonl")
    assert f"--prompt-data {tmp_path / 'missing.jsonl'}: no such file or directory" in err


def test_default_reward_keys_reads_the_task_registry(monkeypatch):
    import sys
    import types

    from relax.cli import build
    from relax.runtime.checks.validation import ConfigError

    monkeypatch.undo()  # the real default_reward_keys, not the fixture's
    fake = types.ModuleType("relax.rollout.tasks")
    tasks = {"sum": types.SimpleNamespace(reward_keys=("exact", "length"))}

    def get_task(name):
        if name not in tasks:
            raise KeyError(f"unknown task {name!r}; built-in tasks: sum")
        return tasks[name]

    fake.get_task = get_task
    monkeypatch.setitem(sys.modules, "relax.rollout.tasks", fake)
    assert build.default_reward_keys("sum") == ("exact", "length")
    with pytest.raises(ConfigError, match="--task nope: unknown task 'nope'"):
        build.default_reward_keys("nope")


def test_reward_keys_default_to_reward_with_custom_data(cli, tmp_path):
    data = tmp_path / "p.jsonl"
    data.write_text('{"prompt": "1+1=", "label": "2"}\n')
    code, config, _ = dry(cli, "--prompt-data", data)
    assert code == 0 and config["reward_keys"] == ["reward"]


# -- the same rules for built-in and user classes ------------------------------------------------

VARIANTS = [
    [],
    ["--reward-keys", "one"],
    ["--n-samples-per-prompt", "1"],
    ["--normalize-advantages"],
    ["--disable-rewards-normalization"],
    ["--kl-coef", "0.1"],
    ["--loss-aggregation", "seq_mean_token_sum"],
    ["--num-steps-per-rollout", "4"],
    ["--global-batch-size", "64"],
    ["--custom-reward-post-process-path", "relax_cli_test_user_algos:hook"],
    ["--dynamic-sampling-filter-path", "relax_cli_test_user_algos:hook"],
]


@pytest.mark.parametrize("builtin", BUILTIN_ALGORITHMS, ids=lambda c: c.name)
def test_user_copy_matches_builtin(cli, user_module, builtin):
    """A user class with a built-in's capabilities gets exactly the built-in's verdicts and messages."""
    copy = f"{user_module}:Copy{builtin.__name__}"
    for variant in VARIANTS:
        b_code, b_out, b_err = cli("train", "--dry-run", "--advantage-estimator", builtin.name, *variant)
        u_code, u_out, u_err = cli("train", "--dry-run", "--advantage-estimator", copy, *variant)
        assert b_code == u_code, (variant, b_err, u_err)
        user_label = f"Copy{builtin.__name__} (--advantage-estimator {copy})"
        builtin_label = f"{builtin.__name__} (--advantage-estimator {builtin.name})"
        assert u_err.replace(user_label, builtin_label) == b_err, variant
        if b_code == 0:
            b_cfg, u_cfg = yaml.safe_load(b_out), yaml.safe_load(u_out)
            for cfg in (b_cfg, u_cfg):
                cfg.pop("advantage_estimator"), cfg.pop("run_name"), cfg.pop("output_dir")
            assert b_cfg == u_cfg


# -- the validation module never names an algorithm ----------------------------------------------


def test_validation_module_has_no_algorithm_name_literal():
    from relax.runtime.checks import (  # the rules' modules
        batch_shape,
        engine_rules,
        method_rules,
        reward_rules,
    )

    modules = (validation, batch_shape, method_rules, reward_rules, engine_rules)
    source = "\n".join(Path(module.__file__).read_text() for module in modules)
    names = algorithm_names()
    assert "gdpo" in names and len(names) >= 2  # the scan below is only meaningful with the real list
    hits = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            for name in names:
                if re.search(rf"(?<![A-Za-z0-9]){re.escape(name)}(?![A-Za-z0-9])", node.value, re.IGNORECASE):
                    hits.append((node.lineno, name, node.value))
    assert hits == []


def test_builtin_gdpo_is_checked_through_its_capabilities():
    # the headline rule must come from the capability, not from the name
    assert get_algorithm("gdpo").uses_reward_components is True


def test_hyperparameter_the_method_does_not_read_warns(cli):
    code, _, err = cli("train", "--dry-run", "--advantage-estimator", "grpo", "--gdpo-preset", "nvlabs-trl")
    assert code == 0
    assert "GRPO (--advantage-estimator grpo) does not read --gdpo-preset (set to 'nvlabs-trl')" in err
    code, _, err = cli("train", "--dry-run", "--advantage-estimator", "ppo", "--lambd", "0.9")
    assert code == 0 and "does not read" not in err  # PPO reads lambda


def test_default_configuration_of_every_builtin_has_no_unread_flag_warning(cli):
    for name in algorithm_names():
        required = ["--normalize-advantages"] if get_algorithm(name).advantage_normalization == "required" else []
        if get_algorithm(name).needs_teacher:  # the shipped warm-up model is a teacher of the built-in task
            required += ["--teacher-checkpoint", str(TINY_CHECKPOINT)]
        code, _, err = cli("train", "--dry-run", "--advantage-estimator", name, *required)
        assert code == 0, (name, err)
        assert "does not read" not in err, (name, err)


def test_critic_with_hf_checkpoint_passes_validation(cli, tmp_path):
    """PPO's critic is a value head on the Hugging Face model (tests/hf/test_train_cli.py trains it)."""
    (tmp_path / "config.json").write_text("{}")
    code, _, err = cli("train", "--dry-run", "--advantage-estimator", "ppo", "--hf-checkpoint", tmp_path)
    assert code == 0, err
    assert "critic" not in err
