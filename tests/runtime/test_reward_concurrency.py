"""``--reward-concurrency``: plain reward functions run in a bounded thread pool, in sample order."""

from __future__ import annotations

import json
import textwrap
import threading

import pytest

from relax.algorithms import AlgorithmConfig
from relax.config.run import RunConfig
from relax.rollout.rewards import RewardError, call_reward_function
from relax.runtime.driver.train import run

# A judge that only answers when four calls are waiting at once: it can pass only if the calls overlap.
JUDGE = textwrap.dedent('''
    import threading

    _barrier = threading.Barrier(4, timeout=30)

    def judge(prompt, completion, label, metadata):
        _barrier.wait()
        return float(len(completion) % 3) + 0.1 * metadata["sample_index"]
''')


def _barrier_reward(parties: int, timeout: float):
    barrier = threading.Barrier(parties, timeout=timeout)

    def reward(prompt, completion, label, metadata):
        barrier.wait()
        return len(completion) + 100 * int(prompt)

    return reward


def test_plain_calls_overlap_and_come_back_in_sample_order():
    prompts = [str(i) for i in range(8)]
    values = call_reward_function(_barrier_reward(4, 10), prompts, ["ab"] * 8, [None] * 8, [{}] * 8, concurrency=4)
    assert values == [2 + 100 * i for i in range(8)]


def test_one_at_a_time_cannot_overlap():
    with pytest.raises(RewardError, match="sample 0: reward function .* raised BrokenBarrierError"):
        call_reward_function(_barrier_reward(2, 0.5), ["0", "1"], ["a", "b"], [None] * 2, [{}] * 2, concurrency=1)


def test_a_failing_call_names_its_sample():
    def reward(prompt, completion, label, metadata):
        if prompt == "3":
            raise KeyError("label")
        return 1.0

    with pytest.raises(RewardError, match="sample 3: reward function .* raised KeyError"):
        call_reward_function(reward, [str(i) for i in range(6)], ["x"] * 6, [None] * 6, [{}] * 6, concurrency=3)


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_relax_train_scores_with_overlapping_calls(ray_cluster, tmp_path, monkeypatch):
    (ray_cluster / "overlap_judge.py").write_text(JUDGE)
    monkeypatch.chdir(ray_cluster)
    out = tmp_path / "judge"
    run(RunConfig(advantage_estimator="grpo", algorithm=AlgorithmConfig(reward_keys=("reward",), n_samples_per_prompt=4),
                  custom_rm_path="overlap_judge:judge", reward_concurrency=4, rollout_batch_size=4,
                  num_steps_per_rollout=1, num_rollout=2, output_dir=str(out), progress=False))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(r["reward/reward/std"] > 0 for r in rows)
