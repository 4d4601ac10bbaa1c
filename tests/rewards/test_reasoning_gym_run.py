"""--task reasoning-gym:chain_sum through run(config) on the session's Ray cluster, with a tiny local
Hugging Face checkpoint: training prompts from the stream, rewards from the dataset's own scorer, an
evaluation on the held-out problems before and after training."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("reasoning_gym", reason="the rewards extra (reasoning-gym) is not installed")
pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")

from tiny_answer_model import build_answer_checkpoint

from relax.algorithms import AlgorithmConfig
from relax.config.run import RunConfig
from relax.rollout.tasks import reasoning_gym

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.filterwarnings("ignore")]


@pytest.mark.timeout(420)
def test_reasoning_gym_task_trains_and_evaluates(ray_cluster, tmp_path):
    from relax.runtime.driver.train import run

    ckpt = build_answer_checkpoint(tmp_path / "tiny")
    out = tmp_path / "run"
    config = RunConfig(
        task="reasoning-gym:chain_sum", hf_checkpoint=str(ckpt),
        algorithm=AlgorithmConfig(reward_keys=("score", "has_answer"), n_samples_per_prompt=4),
        rollout_batch_size=4, num_rollout=3, rollout_max_response_len=16, lr=1e-3, seed=7,
        log_completions=64, output_dir=str(out), progress=False,
    )
    summary = run(config)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    for row in rows[1:]:
        assert {"reward/score/mean", "reward/has_answer/mean"} <= set(row)
    assert any(r["reward/has_answer/mean"] > 0 for r in rows[1:])  # the tags were sampled: a signal
    evaluated = {r["step"]: r for r in rows if "eval/num_prompts" in r}
    assert sorted(evaluated) == [0, 3]
    assert all(r["eval/num_prompts"] == reasoning_gym.HELD_OUT and "eval/score/mean" in r
               for r in evaluated.values())
    assert summary.eval_after["eval/policy_version"] == 3

    samples = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    evals = [s for s in samples if s["split"] == "eval" and s["step"] == 0]
    held_out = [reasoning_gym.entry("chain_sum", 7, i) for i in range(reasoning_gym.HELD_OUT)]
    assert [s["prompt"] for s in evals] == [p["question"] + reasoning_gym.INSTRUCTION for p in held_out]
    # every logged score is the dataset's own scorer's verdict on that completion
    dataset = reasoning_gym.dataset("chain_sum", 7)
    for sample, problem in zip(evals, held_out):
        answer = reasoning_gym.extract_answer(sample["completion"])
        assert sample["rewards"]["score"] == dataset.score_answer(answer, problem)
    assert sum(s["rewards"]["score"] for s in evals) / len(evals) == pytest.approx(evaluated[0]["eval/score/mean"])
    train = [s for s in samples if s["split"] == "train"]
    assert train and not {s["prompt"] for s in train} & {s["prompt"] for s in evals}
