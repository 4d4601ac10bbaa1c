"""DAPO's over-long handling: which responses are truncated, over-long filtering in the rollout
stage (the loss mask, the plan's token and sequence counts) and the soft over-long punishment."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from relax.algorithms import AlgorithmConfig
from relax.config.run import RunConfig
from relax.rewards import overlong
from relax.rollout.truncation import filter_overlong, truncated_rows
from relax.runtime.step.rollout_worker import RolloutCore
from relax.runtime.step.schedule import plan_step

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from memory_plane import MemoryDataPlane  # noqa: E402

EOS = 9
KEYS = ("correct", "digits", "format", "length")


# -- truncation --


def test_truncated_means_the_limit_reached_without_end_of_sequence():
    ids = torch.tensor([[1, 2, 3, 4], [1, 2, 3, EOS], [1, EOS, 0, 0], [5, 6, 7, 0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]], dtype=torch.bool)
    # row 0: 4 tokens, no EOS -> cut; row 1 ends in EOS at the limit; rows 2, 3 stopped early
    assert truncated_rows(ids, mask, 4, EOS).tolist() == [True, False, False, False]
    # with a limit of 3 the 3-token row 3 was cut too (its last valid token, 7, is not EOS)
    assert truncated_rows(ids, mask, 3, EOS).tolist() == [True, False, False, True]
    filtered = filter_overlong(mask, truncated_rows(ids, mask, 4, EOS))
    assert filtered.sum(1).tolist() == [0, 4, 2, 3]


# -- the plan's counts --


def test_plan_counts_only_the_sequences_that_kept_a_token():
    # groups of 4; group 10 lost two samples to the filter, group 11 none
    plan = plan_step([10, 11, 12], [9, 20, 6], 4, 2, 1, group_sequences=[2, 4, 3])
    assert plan.minibatches == ((10, 11), (12,))
    assert plan.global_tokens == (29, 6)
    assert plan.global_sequences == (6, 3)
    assert plan.segment_sizes == (8, 4)  # the advantages still see every sample
    assert plan_step([10, 11, 12], [9, 20, 6], 4, 2, 1).global_sequences == (8, 4)


# -- the rollout stage --


def _rollout(overlong_filter: bool):
    cfg = RunConfig(advantage_estimator="grpo", algorithm=AlgorithmConfig(n_samples_per_prompt=4, reward_keys=KEYS),
                    rollout_batch_size=4, rollout_max_response_len=6, seed=3, overlong_filter=overlong_filter)
    plane = MemoryDataPlane()
    core = RolloutCore(cfg, "grpo", plane)
    report = core.step(1)
    fields = plane.read(1, ("response_ids", "response_mask"), "check", len(report["kept_uids"]),
                        report["kept_uids"]).fields
    return core, report, fields


def test_the_filter_empties_the_loss_mask_of_truncated_samples_and_the_counts_follow():
    core, plain, plain_fields = _rollout(False)
    _, report, fields = _rollout(True)
    ids, mask = plain_fields["response_ids"], plain_fields["response_mask"].bool()
    cut = truncated_rows(ids, mask, 6, core.tokenizer.eos_id)
    assert 0 < int(cut.sum()) < len(cut), "the fixed seed should truncate some responses, not all"
    assert report["kept_uids"] == plain["kept_uids"] and torch.equal(fields["response_ids"], ids)
    # truncated rows lose every loss token; the others keep theirs exactly
    assert not fields["response_mask"][cut].any()
    assert torch.equal(fields["response_mask"][~cut].bool(), mask[~cut])
    # the plan's inputs: tokens and sequences left after the filter, per group of 4
    assert report["group_tokens"] == (mask & ~cut[:, None]).sum(1).view(-1, 4).sum(1).tolist()
    assert report["group_sequences"] == (~cut).view(-1, 4).sum(1).tolist()
    assert report["overlong_filtered"] == int(cut.sum())
    assert plain["group_tokens"] == mask.sum(1).view(-1, 4).sum(1).tolist()
    assert "group_sequences" not in plain and "overlong_filtered" not in plain


# -- the soft punishment --


@pytest.mark.parametrize("length, expected", [
    (0, 0.0), (6, 0.0),  # up to L_max - L_cache = 6: no punishment
    (7, -0.25), (8, -0.5), (9, -0.75), (10, -1.0),  # linear over the last L_cache = 4 tokens
    (11, -1.0), (50, -1.0),  # beyond L_max
])
def test_punishment_by_hand(length, expected):
    assert overlong.punishment(length, 10, 4) == expected


def test_the_reward_function_reads_the_length_and_the_limit_from_the_metadata():
    fn = overlong.soft_punishment(cache_length=4)
    assert fn("p", "c", None, {"response_tokens": 9, "max_response_tokens": 10}) == {"overlong": -0.75}
    fixed = overlong.soft_punishment(cache_length=2, max_length=6, key="len_penalty")
    assert fixed("p", "c", None, {"response_tokens": 5, "max_response_tokens": 100}) == {"len_penalty": -0.5}
    with pytest.raises(KeyError, match="response_tokens"):
        fn("p", "c", None, {})
    with pytest.raises(ValueError, match="--rollout-max-response-len"):
        fn("p", "c", None, {"response_tokens": 1, "max_response_tokens": 3})
    with pytest.raises(ValueError, match="cache_length"):
        overlong.soft_punishment(cache_length=0)


def test_the_rollout_gives_reward_functions_the_token_count():
    seen = []

    def reward(prompt, completion, label, metadata):
        seen.append((metadata["response_tokens"], metadata["max_response_tokens"]))
        return {"reward": float(metadata["response_tokens"])}

    cfg = RunConfig(advantage_estimator="grpo", algorithm=AlgorithmConfig(n_samples_per_prompt=4), rollout_batch_size=4,
                    rollout_max_response_len=6, seed=3)
    core = RolloutCore(cfg, "grpo", MemoryDataPlane())
    core.reward_fn = reward
    r = core._sample_round(1, 0, 4)
    lengths = r["gen"].batch.response_mask.sum(1).tolist()
    assert [s for s, _ in seen] == lengths and {m for _, m in seen} == {6}
    assert r["rewards"][:, 0].tolist() == [float(n) for n in lengths]


def test_the_filter_is_refused_for_multi_turn_episodes():
    from relax.algorithms import get_algorithm
    from relax.runtime.checks.validation import ConfigError, validate

    cfg = RunConfig(advantage_estimator="grpo", algorithm=AlgorithmConfig(n_samples_per_prompt=4, reward_keys=KEYS),
                    env_path="my_envs:make_env", overlong_filter=True)
    with pytest.raises(ConfigError, match="--overlong-filter .* multi-turn"):
        validate(cfg, get_algorithm("grpo"))
