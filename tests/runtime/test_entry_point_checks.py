"""One validation for every entry point (``run(config)`` from Python applies the CLI's rules), and
``--load`` compares the reward and the hyper-parameters with the checkpoint's."""

from __future__ import annotations

import pytest

from relax.algorithms import AlgorithmConfig
from relax.config.run import RunConfig
from relax.runtime.checks.validation import ConfigError
from relax.runtime.driver.train import run
from relax.runtime.files.checkpoint_files import CheckpointError, algorithm_settings, check_checkpoint

KEYS = ("correct", "format")


def test_run_from_python_refuses_what_relax_train_refuses(tmp_path):
    # (reward_keys left at ("reward",) would get the built-in task's four components, as relax train gives
    # them: relax.runtime.checks.entry; one named component is refused)
    config = RunConfig(advantage_estimator="gdpo", algorithm=AlgorithmConfig(reward_keys=("correct",)),
                       output_dir=str(tmp_path / "never"))
    with pytest.raises(ConfigError, match=r"GDPO \(--advantage-estimator gdpo\) needs at least two reward keys"):
        run(config)
    with pytest.raises(ConfigError, match="--disable-rewards-normalization"):
        run(RunConfig(advantage_estimator="rloo", algorithm=AlgorithmConfig(rewards_normalization=False),
                      output_dir=str(tmp_path / "never")))
    assert not (tmp_path / "never").exists()  # refused before anything was created


def _state(config: RunConfig) -> dict:
    return {"step": 2, "advantage_estimator": config.advantage_estimator, "critic": None, "backend": "torch",
            "actor": {"backend": {}}, "rollout": [{"prompts": {}}], "algorithm": algorithm_settings(config)}


def _config(**algorithm) -> RunConfig:
    return RunConfig(num_rollout=4, algorithm=AlgorithmConfig(**{"reward_keys": KEYS, **algorithm}))


def test_resume_refuses_another_reward_with_the_diff():
    state = _state(_config())
    assert check_checkpoint(_config(), state, "run1", has_critic=False) == []
    with pytest.raises(CheckpointError, match=r"another reward \(reward_weights: checkpoint \(1.0, 1.0\), this run "
                                              r"\(1.0, 2.0\)\); resume with the checkpoint's"):
        check_checkpoint(_config(reward_weights=(1.0, 2.0)), state, "run1", has_critic=False)
    with pytest.raises(CheckpointError, match=r"reward_keys: checkpoint \('correct', 'format'\), this run \('correct', 'digits'\)"):
        check_checkpoint(_config(reward_keys=("correct", "digits")), state, "run1", has_critic=False)


def test_resume_warns_about_changed_hyperparameters():
    state = _state(_config())
    warnings = check_checkpoint(_config(eps_clip=0.1, kl_coef=0.01), state, "run1", has_critic=False)
    assert warnings == [
        "--load run1: eps_clip differs from the checkpoint's (0.2 -> 0.1); the rest of the run uses the new value",
        "--load run1: eps_clip_high differs from the checkpoint's (0.2 -> 0.1); the rest of the run uses the new value",
        "--load run1: kl_coef differs from the checkpoint's (0.0 -> 0.01); the rest of the run uses the new value",
    ]
    del state["algorithm"]  # a checkpoint written before the settings were stored: nothing to compare
    assert check_checkpoint(_config(eps_clip=0.1), state, "run1", has_critic=False) == []


def test_dynamic_sampling_and_hook_rules():
    from relax.algorithms import get_algorithm
    from relax.runtime.checks.validation import validate

    grpo, ppo = get_algorithm("grpo"), get_algorithm("ppo")
    with pytest.raises(ConfigError, match=r"--custom-reward-post-process-path m:f replaces the reward stage, so "
                                          r"--disable-rewards-normalization would do nothing"):
        validate(RunConfig(custom_reward_post_process_path="m:f",
                           algorithm=AlgorithmConfig(rewards_normalization=False)), grpo)
    with pytest.raises(ConfigError, match=r"--over-sampling-batch-size 6 must be a multiple of --rollout-num-workers 4"):
        validate(RunConfig(over_sampling_batch_size=6, rollout_num_workers=4), grpo)
    assert validate(RunConfig(max_sampling_rounds=3), grpo) == []
    assert validate(RunConfig(advantage_estimator="ppo", max_sampling_rounds=3), ppo) == [(
        "--max-sampling-rounds 3 has no effect: PPO (--advantage-estimator ppo) keeps every prompt group "
        "(group_relative = False) and no --dynamic-sampling-filter-path drops any, so the first round always "
        "fills the batch")]
    assert validate(RunConfig(advantage_estimator="ppo", max_sampling_rounds=3,
                              dynamic_sampling_filter_path="m:f"), ppo) == []
    assert "trains on at most 8 prompt groups" in validate(RunConfig(over_sampling_batch_size=8), grpo)[0]

