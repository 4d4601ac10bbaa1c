"""TextArena (the envs extra): a game as a relax environment, and 3 training steps on it with a tiny
Hugging Face checkpoint through ``relax train``."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("textarena", reason="the envs extra (textarena) is not installed")
pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")

from relax.rollout.environments.textarena import GuessTheNumber, TextArenaEnv, opening_prompts
from tests.runtime.run_results import training_rows


def test_guess_the_number_plays_to_the_end():
    (row,) = opening_prompts("GuessTheNumber-v0", [3])
    assert "Guess The Number" in row["prompt"] and row["metadata"] == {"env_id": "GuessTheNumber-v0", "seed": 3}
    env = GuessTheNumber()
    env.reset({"prompt": row["prompt"], "label": None, "metadata": row["metadata"]})
    invalid = env.step("no brackets")
    assert not invalid.done and "invalid move" in invalid.observation
    for guess in range(1, 21):  # the game answers every guess until one is right
        step = env.step(f"[{guess}]")
        if step.done:
            break
        assert step.observation in ("The target number is lower.", "The target number is higher.")
    assert step.done and step.rewards == {"reward": 1.0}


def test_a_row_must_name_its_game():
    with pytest.raises(ValueError, match="metadata.env_id"):
        TextArenaEnv().reset({"prompt": "", "label": None, "metadata": {}})


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_relax_train_three_steps_on_guess_the_number(ray_cluster, tmp_path, monkeypatch):
    from relax.cli.main import main
    from relax.models.hf.tiny_random import build_tiny_random_checkpoint

    ckpt = build_tiny_random_checkpoint(tmp_path / "tiny", "qwen3", hidden=64, layers=1)
    data = tmp_path / "guess.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in opening_prompts("GuessTheNumber-v0", range(4))))
    monkeypatch.chdir(ray_cluster)
    out = tmp_path / "guess"
    argv = ["train", "--hf-checkpoint", str(ckpt), "--prompt-data", str(data), "--metadata-key", "metadata",
            "--apply-chat-template", "--env-path", "relax.rollout.environments.textarena:TextArenaEnv",
            "--reward-keys", "reward", "--advantage-estimator", "reinforce_plus_plus", "--normalize-advantages",
            "--max-turns", "3",
            "--num-rollout", "3", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
            "--rollout-max-response-len", "6", "--log-completions", "4", "--output-dir", str(out),
            "--no-progress", "--seed", "1"]
    assert main(argv) == 0
    rows = training_rows(out)
    assert [r["step"] for r in rows] == [1, 2, 3]
    # a random model's moves are invalid: the game warns once (a second turn), then ends the episode
    assert all(r["rollout/turns_mean"] > 1 and r["rollout/env_token_frac"] > 0 for r in rows)
    samples = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    assert any("invalid move" in s["completion"] for s in samples)
