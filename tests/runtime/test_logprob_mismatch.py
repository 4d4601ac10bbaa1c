"""``rollout/logprob_abs_diff``: the token mean of |engine - trainer| log-prob over response tokens,
as a share of the mini-batch like the health metrics; and which runs carry the engine's log-probs."""

from __future__ import annotations

import attrs
import pytest
import torch

from relax.config.algorithm import AlgorithmConfig
from relax.config.run import RunConfig
from relax.rollout.engines import carries_behaviour_log_probs, config_errors, engine_name
from relax.runtime.metrics.actor_metrics import combine_actor_metrics, logged_name, policy_health_shares


def test_the_share_by_hand():
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    shard = {
        "old_entropy": torch.zeros(2, 3),
        "old_log_probs": torch.tensor([[-1.0, -2.0, -0.5], [-0.1, -3.0, 0.0]]),
        "fields": {"rollout_log_probs": torch.tensor([[-1.25, -2.0, -0.25], [-0.1, -2.5, -9.0]])},
    }
    # |diff| over the five real tokens: 0.25 + 0 + 0.25 + 0 + 0.5 (the padded -9.0 is masked out);
    # this rank holds 5 of the mini-batch's 10 tokens
    share = policy_health_shares(shard, slice(0, 2), mask, 10.0, "k1")["logprob_abs_diff"]
    assert share == pytest.approx(1.0 / 10)
    # two data-parallel ranks' shares sum to the mini-batch mean; the row name is rollout/...
    combined = combine_actor_metrics([[{"logprob_abs_diff": share}], [{"logprob_abs_diff": 0.3}]])
    assert combined["logprob_abs_diff"] == pytest.approx(0.4)
    assert logged_name("logprob_abs_diff") == "rollout/logprob_abs_diff"
    assert logged_name("policy_entropy") == "actor/policy_entropy"
    del shard["fields"]  # no engine log-probs: no metric
    assert "logprob_abs_diff" not in policy_health_shares(shard, slice(0, 2), mask, 10.0, "k1")


def test_which_runs_carry_the_engine_log_probs():
    base = RunConfig(hf_checkpoint="/ckpt")
    assert engine_name(RunConfig()) == "tiny" and engine_name(base) == "hf"
    assert not carries_behaviour_log_probs(base)
    assert carries_behaviour_log_probs(attrs.evolve(base, rollout_engine="vllm"))
    tis = attrs.evolve(base, algorithm=AlgorithmConfig(off_policy_correction="tis"))
    assert carries_behaviour_log_probs(tis)


@pytest.mark.parametrize("config,expected", [
    (RunConfig(rollout_engine="tiny", hf_checkpoint="/ckpt"), "--rollout-engine tiny samples from the built-in model"),
    (RunConfig(rollout_engine="hf"), "--rollout-engine hf generates from a Hugging Face model: give --hf-checkpoint"),
    (RunConfig(rollout_engine="vllm"), "--rollout-engine vllm generates from a Hugging Face model"),
])
def test_an_engine_that_does_not_fit_the_model_is_refused(config, expected):
    errors = config_errors(config)
    assert len(errors) == 1 and errors[0].startswith(expected)
