"""The reward services end to end through ``relax train`` on the shared Ray cluster: a tiny random
sequence-classification reward model (``--reward-model-path``) mixed with a reward function's
component under GDPO, with two rollout workers and an evaluation; and a tiny judge
(``--judge-model-path``) with ``--fully-async``. Every step's samples reach the service together, so
its batches hold more than one sample (``reward_model/batch_size_mean`` > 1), and the logged scores
equal the reward model called directly on each text."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from relax.models.hf.tiny_random import build_tiny_random_checkpoint, build_tiny_reward_model

TOY_REWARD = Path(__file__).parents[1] / "hf" / "toy_reward.py"


def _prompts(path: Path, count: int) -> str:
    path.write_text("".join(json.dumps({"q": f"What is {i} + 3?", "a": i + 3}) + "\n" for i in range(count)))
    return str(path)


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _common(tmp_path: Path, policy: Path) -> list[str]:
    return ["--hf-checkpoint", str(policy), "--prompt-data", _prompts(tmp_path / "train.jsonl", 8),
            "--input-key", "q", "--label-key", "a", "--custom-rm-path", "toy_reward:reward",
            "--advantage-estimator", "gdpo", "--n-samples-per-prompt", "4", "--rollout-batch-size", "4",
            "--num-steps-per-rollout", "1", "--rollout-max-response-len", "6", "--no-progress",
            "--output-dir", str(tmp_path / "run")]


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_reward_model_on_serve_mixes_with_a_function_reward_under_gdpo(ray_cluster, tmp_path, monkeypatch, capsys):
    from relax.cli.main import main

    shutil.copy(TOY_REWARD, ray_cluster / "toy_reward.py")
    monkeypatch.chdir(ray_cluster)
    policy = build_tiny_random_checkpoint(tmp_path / "policy", "qwen2")
    rm = build_tiny_reward_model(tmp_path / "rm")
    argv = ["train", *_common(tmp_path, policy), "--reward-model-path", str(rm), "--reward-keys", "digits", "rm",
            "--num-rollout", "3", "--rollout-num-workers", "2", "--reward-model-batch-size", "16",
            "--reward-model-batch-wait-s", "0.2", "--reward-model-cpus", "0.5",
            "--eval-prompt-data", _prompts(tmp_path / "eval.jsonl", 4), "--no-eval-before-train",
            "--log-completions", "16"]
    assert main(argv) == 0
    # the start-up says where the service runs (no GPU here: the CPU), beside the workers' devices
    err = capsys.readouterr().err
    assert f"relax: devices: the reward model service (--reward-model-path {rm}): 1 replica(s) on the CPU" in err
    rows = _rows(tmp_path / "run")
    train = [r for r in rows if "reward/rm/mean" in r]
    assert [r["step"] for r in train] == [1, 2, 3]
    for r in train:
        # 16 samples per step, 8 from each worker, all sent at once: batched, never above the cap
        assert 1 < r["reward_model/batch_size_mean"] <= 16, r
        assert r["reward_model/time_s"] > 0 and r["reward/rm/std"] > 0  # a random RM scores samples apart
        assert "reward/digits/mean" in r and "multi_reward/gdpo_cancel_rate" in r
    assert any("eval/rm/mean" in r for r in rows)  # the evaluation is scored by the service too
    # the served scores (batched, both workers' samples together) are the model's on each text alone
    from relax.rollout.reward_scorers import SequenceScorer

    logged = [json.loads(line) for line in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    logged = [x for x in logged if x["split"] == "train"]
    assert len(logged) == 48
    direct = SequenceScorer(str(rm)).score([(x["prompt"], x["completion"], None) for x in logged])
    assert [x["rewards"]["rm"] for x in logged] == pytest.approx(direct, abs=1e-5)


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_judge_on_serve_scores_with_its_yes_probability_in_an_asynchronous_run(ray_cluster, tmp_path,
                                                                                 monkeypatch):
    from relax.cli.main import main

    shutil.copy(TOY_REWARD, ray_cluster / "toy_reward.py")
    monkeypatch.chdir(ray_cluster)
    policy = build_tiny_random_checkpoint(tmp_path / "policy", "qwen2")
    template = tmp_path / "judge.txt"
    template.write_text("Question: {prompt}\nAnswer: {response}\nExpected: {label}\nIs the answer right?")
    argv = ["train", *_common(tmp_path, policy), "--judge-model-path", str(policy), "--judge-template",
            str(template), "--judge-key", "verdict", "--reward-keys", "digits", "verdict", "--num-rollout", "2",
            "--fully-async", "--judge-batch-size", "8", "--judge-batch-wait-s", "0.2", "--judge-cpus", "0.5",
            "--judge-replicas", "2"]
    assert main(argv) == 0
    rows = [r for r in _rows(tmp_path / "run") if "reward/verdict/mean" in r]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        # 16 samples, all sent at once, at most 8 per batched call: two calls or more
        assert 1 < r["judge/batch_size_mean"] <= 8 and r["judge/calls"] >= 2, r
        assert 0 < r["reward/verdict/mean"] < 1  # a probability
    # two replicas: Serve's router sends the second batch's requests to the idle one
    assert max(r["judge/replicas_used"] for r in rows) == 2
