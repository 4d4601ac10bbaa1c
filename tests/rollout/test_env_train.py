"""Done-when of multi-turn rollouts: a user's two-turn environment trains GDPO through ``relax train``."""

from __future__ import annotations

import json
import textwrap

import pytest

from tests.runtime.run_results import metrics_rows, training_rows

# Turn 1: any answer, the environment replies "7"; turn 2 is rewarded with `seven` and `short`.
TWO_TURN = textwrap.dedent('''
    from relax.rollout import Environment, EnvStep

    class TwoTurn(Environment):
        def reset(self, sample):
            self.turn = 0

        def step(self, completion):
            self.turn += 1
            if self.turn == 1:
                return EnvStep(observation="7")
            return EnvStep(done=True, rewards={"seven": float("7" in completion),
                                               "short": 1.0 - len(completion) / 40},
                           info={"answer": completion})
''')


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_relax_train_gdpo_on_a_two_turn_environment(ray_cluster, tmp_path, monkeypatch, capsys):
    from relax.cli.main import main

    (ray_cluster / "relax_two_turn_env.py").write_text(TWO_TURN)
    monkeypatch.chdir(ray_cluster)
    out = tmp_path / "two_turn"
    argv = ["train", "--advantage-estimator", "gdpo", "--env-path", "relax_two_turn_env:TwoTurn",
            "--max-turns", "4", "--reward-keys", "seven", "short", "--num-rollout", "3",
            "--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--rollout-max-response-len", "4",
            "--log-completions", "8", "--output-dir", str(out), "--no-progress", "--seed", "3"]
    assert main(argv) == 0
    assert "warm-up base rates" not in capsys.readouterr().err  # the addition task's: not this run's news
    rows = training_rows(out)
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert r["rollout/turns_mean"] == 2
        assert 0 < r["rollout/env_token_frac"] < 1 and r["time/rollout/env_s"] >= 0
        assert r["rollout/tool_calls_mean"] == 0
        assert 0 <= r["reward/seven/mean"] <= 1 and 0 < r["reward/short/mean"] < 1
    evaluation = [r for r in metrics_rows(out) if r["step"] == 0]  # held-out problems, also as episodes
    assert evaluation and "eval/seven/mean" in evaluation[0]
    samples = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    train = [s for s in samples if s["split"] == "train"]
    assert train and all("<eos>7" in s["completion"] or "7" in s["completion"] for s in train)
    assert {"seven", "short"} <= set(train[0]["rewards"])
