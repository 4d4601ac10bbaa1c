"""The unbiased pass@k estimator and the evaluation metrics merged from several rollout workers,
against values computed by hand."""

from __future__ import annotations

import attrs
import pytest
import torch

from relax.algorithms import AlgorithmConfig
from relax.config.run import RunConfig
from relax.runtime.driver.evaluation import eval_metrics, pass_at_k
from relax.runtime.metrics.step_metrics import EVAL_COMPLETIONS_KEY
from relax.runtime.step.eval_sampling import pass_component, slice_bounds


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 1, 2 / 5),  # 1 - C(3,1)/C(5,1) = 1 - 3/5
        (5, 2, 2, 7 / 10),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (5, 2, 5, 1.0),  # n - c = 3 < 5: every draw of 5 holds a pass
        (5, 2, 3, 1.0 - 1 / 10),  # 1 - C(3,3)/C(5,3)
        (5, 0, 1, 0.0),
        (5, 0, 5, 0.0),
        (5, 5, 1, 1.0),
        (5, 5, 5, 1.0),
        (1, 1, 1, 1.0),
        (1, 0, 1, 0.0),
    ],
)
def test_pass_at_k_hand_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-15)


def test_pass_at_1_is_the_pass_rate_and_bad_arguments_are_refused():
    for n in range(1, 9):
        for c in range(n + 1):
            assert pass_at_k(n, c, 1) == pytest.approx(c / n)
    for bad in ((5, 6, 1), (5, -1, 1), (5, 2, 0), (5, 2, 6)):
        with pytest.raises(ValueError, match="pass@k needs"):
            pass_at_k(*bad)


def test_the_pass_component_is_reward_key_then_correct_then_the_first_key():
    keys = ("format", "correct")
    config = RunConfig(algorithm=AlgorithmConfig(reward_keys=keys, reward_weights=(1.0, 1.0)))
    assert pass_component(config) == "correct"
    assert pass_component(attrs.evolve(config, reward_key="format")) == "format"
    plain = RunConfig(algorithm=AlgorithmConfig(reward_keys=("score", "style"), reward_weights=(1.0, 1.0)))
    assert pass_component(plain) == "score"


def test_slices_cover_every_prompt_once():
    for count in range(23):
        for workers in range(1, 5):
            bounds = [slice_bounds(count, workers, i) for i in range(workers)]
            assert [i for lo, hi in bounds for i in range(lo, hi)] == list(range(count))
            assert max(hi - lo for lo, hi in bounds) - min(hi - lo for lo, hi in bounds) <= 1


def _report(rewards, lengths, n, records=()):
    rewards = torch.tensor(rewards, dtype=torch.float32)
    return {"n": n, "prompts": rewards.shape[0] // n, "rewards": rewards, "lengths": list(lengths),
            "completions": list(records)}


def test_metrics_merged_from_two_workers_by_hand():
    # keys (correct, digits); n = 3 samples per prompt; worker 0 holds prompts A, B, worker 1 prompt C.
    config = RunConfig(
        algorithm=AlgorithmConfig(reward_keys=("correct", "digits"), reward_weights=(1.0, 1.0)),
        eval_n_samples_per_prompt=3,
    )
    w0 = _report([[1, 1], [0, .5], [0, 0],      # A: c = 1
                  [0, 0], [0, 0], [0, .5]],     # B: c = 0
                 [4, 5, 6, 4, 4, 4], 3, records=[{"prompt": "A"}])
    w1 = _report([[1, 1], [1, 1], [0, .5]],     # C: c = 2
                 [5, 5, 2], 3, records=[{"prompt": "C"}])
    m = eval_metrics(config, [w0, w1], version=7)
    assert m["eval/policy_version"] == 7 and m["eval/num_prompts"] == 3
    assert m["eval/correct/mean"] == pytest.approx(3 / 9)
    assert m["eval/digits/mean"] == pytest.approx((1 + .5 + .5 + 1 + 1 + .5) / 9)
    # pass@3: A 1, B 0, C 1; pass@1: A 1/3, B 0, C 2/3
    assert m["eval/pass@3"] == pytest.approx(2 / 3)
    assert m["eval/pass@1"] == pytest.approx((1 / 3 + 0 + 2 / 3) / 3)
    assert m["eval/response_len"] == pytest.approx(39 / 9)
    assert m[EVAL_COMPLETIONS_KEY] == [{"prompt": "A"}, {"prompt": "C"}]  # worker order
    # the threshold decides what passes: digits >= 0.5 with --reward-key digits
    m = eval_metrics(attrs.evolve(config, reward_key="digits", eval_pass_threshold=0.5), [w0, w1], version=7)
    # A: 2 of 3, B: 1 of 3, C: 3 of 3
    assert m["eval/pass@1"] == pytest.approx((2 / 3 + 1 / 3 + 1) / 3)
    assert m["eval/pass@3"] == pytest.approx(1.0)


def test_one_sample_per_prompt_logs_only_pass_at_1():
    config = RunConfig(algorithm=AlgorithmConfig(reward_keys=("correct", "digits"), reward_weights=(1.0, 1.0)))
    m = eval_metrics(config, [_report([[1, 1], [0, 0], [1, .5], [0, 1]], [4] * 4, 1)], version=0)
    assert m["eval/pass@1"] == pytest.approx(0.5) == m["eval/correct/mean"]
    assert not any(k.startswith("eval/pass@") and k != "eval/pass@1" for k in m)


def test_the_summary_names_what_was_measured():
    from relax.runtime.driver.evaluation import describe_eval_set

    config = RunConfig(algorithm=AlgorithmConfig(reward_keys=("correct", "digits"), reward_weights=(1.0, 1.0)))
    assert describe_eval_set(config, "held-out", 20) == "held-out accuracy (correct, greedy, 20 problems)"
    sampled = attrs.evolve(config, eval_temperature=0.7, eval_n_samples_per_prompt=4, eval_pass_threshold=0.5,
                           eval_prompt_data="test.jsonl")
    assert describe_eval_set(sampled, "file", 7) == (
        "eval pass@1 (correct >= 0.5, temperature 0.7, 4 samples, 7 prompts of test.jsonl)")
