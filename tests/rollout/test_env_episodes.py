"""The turn loop (``relax.rollout.environments``) on the tiny model: episode layout, masks, behaviour
log-probs, rewards, metrics and the errors that name environment, episode, turn and step."""

from __future__ import annotations

import asyncio
import math
import time

import pytest
import torch

from relax.backends.torch_backend import TorchBackend
from relax.models.tiny.weights import load_warmup_model
from relax.rollout import Environment, EnvStep
from relax.rollout.base import Prompt, SamplingParams
from relax.rollout.environments import EpisodeError
from relax.rollout.environments.episodes import EpisodeRunner, episode_metrics
from relax.rollout.sampling import sample_groups
from relax.rollout.tiny.engine import TinyEngine

KEYS = ("seven", "short")
PROMPTS = [Prompt(text="<bos>3+4=", label=7), Prompt(text="<bos>1+2=", label=3)]


class TwoTurn(Environment):
    """Turn 1: any answer, the environment replies "7"; turn 2 is scored."""

    def reset(self, sample):
        self.turn, self.label = 0, sample["label"]

    def step(self, completion):
        self.turn += 1
        if self.turn == 1:
            return EnvStep(observation="7", info={"tool_calls": 1})
        return EnvStep(done=True, rewards={"seven": float("7" in completion), "short": 1 - len(completion) / 40})


def _sample(make_env, *, max_turns=4, max_new_tokens=4, timeout=None, n=3, step=None):
    engine = TinyEngine(load_warmup_model())
    runner = EpisodeRunner(make_env=make_env, env_name="tests:Env", max_turns=max_turns, timeout=timeout).at_step(step)
    scored = sample_groups(engine, PROMPTS, n, SamplingParams(max_new_tokens=max_new_tokens),
                           generator=torch.Generator().manual_seed(0), reward_fn=None, reward_keys=KEYS,
                           episodes=runner)
    return engine, scored


def test_two_turn_episode_layout_masks_and_rewards():
    engine, scored = _sample(TwoTurn)
    batch, seven_id = scored.batch, engine.tokenizer.encode("7")[0]
    assert batch.response_attention_mask is not None and len(batch) == 6
    for row in range(6):
        turns = scored.metadata[row]["turns"]
        assert [t["role"] for t in turns] == ["assistant", "environment", "assistant"]
        first = len(engine.tokenizer.encode(turns[0]["text"]))
        # the observation token follows the first turn: attended, not in the loss mask, log-prob 0
        assert batch.response_ids[row, first].item() == seven_id
        assert not batch.response_mask[row, first] and batch.response_attention_mask[row, first]
        assert scored.generation.log_probs[row, first].item() == 0.0
        assert int(batch.response_mask[row].sum()) == int(batch.response_attention_mask[row].sum()) - 1
        assert "7" in scored.completions[row] and scored.completions[row].startswith(turns[0]["text"])
        assert scored.rewards[row].tolist() == [float("7" in turns[2]["text"]), 1 - len(turns[2]["text"]) / 40]
    assert scored.owner.tolist() == [0, 0, 0, 1, 1, 1]
    assert [m["sample_index"] for m in scored.metadata] == [0, 1, 2, 0, 1, 2]
    metrics = episode_metrics([scored.episode_stats])
    assert metrics["rollout/turns_mean"] == 2 and metrics["rollout/tool_calls_mean"] == 1
    assert metrics["rollout/env_token_frac"] == pytest.approx(6 / int(batch.response_attention_mask.sum()))


def test_behaviour_log_probs_are_the_trainers_on_model_tokens():
    """Generating turn 2 from the episode so far and scoring the whole episode in one forward give
    the same log-probs: the observation is attended at the right positions in both."""
    engine, scored = _sample(TwoTurn)
    trainer = TorchBackend(engine.model).compute_log_probs(scored.batch)
    mask = scored.batch.response_mask
    torch.testing.assert_close(trainer.log_probs[mask], scored.generation.log_probs[mask], rtol=0, atol=1e-4)
    assert bool((trainer.log_probs[~mask] == 0).all())


def test_async_environment_and_max_turns():
    class Echo(Environment):
        async def reset(self, sample):
            await asyncio.sleep(0)

        async def step(self, completion):
            await asyncio.sleep(0)
            return EnvStep(observation="1", rewards={"seven": 1.0, "short": 0.5})  # never done

    _, scored = _sample(Echo, max_turns=2, max_new_tokens=2)
    assert all([t["role"] for t in m["turns"]] == ["assistant", "environment", "assistant", "environment"]
               for m in scored.metadata)
    # summed over the two steps; the last observation is logged but not in the sequence
    assert scored.rewards.tolist() == [[2.0, 1.0]] * 6
    assert not scored.metadata[0]["turns"][-1]["in_sequence"]


def test_the_context_limit_ends_an_episode():
    class Endless(Environment):
        def step(self, completion):
            return EnvStep(observation="12", rewards={"seven": 0.0, "short": 0.0})

    engine, scored = _sample(Endless, max_turns=10, max_new_tokens=8)
    limit = engine.model.config.max_seq_len
    assert scored.batch.prompt_width + scored.batch.response_ids.shape[1] <= limit
    assert scored.episode_stats["turns"] < 10 * 6


class _Bad(Environment):
    def __init__(self, result):
        self.result = result

    def step(self, completion):
        if isinstance(self.result, Exception):
            raise self.result
        return self.result() if callable(self.result) else self.result


@pytest.mark.parametrize("result, match", [
    (KeyError("board"), (r"environment tests:Env, episode 0 \(prompt '<bos>3\+4='\), turn 1, training step 5: "
                         r"step\(\) raised KeyError")),
    ({"observation": "7"}, r"turn 1, training step 5: step\(\) returned dict; it must return relax.rollout.EnvStep"),
    (EnvStep(done=True, rewards={"seven": math.nan, "short": 0.0}), r"reward 'seven' = nan, which is not a finite"),
    (EnvStep(done=True, rewards={"seven": True, "short": 0.0}), r"reward 'seven' = True of type bool"),
    (EnvStep(done=True, rewards={"seven": 1.0}), r"ended without reward component\(s\) 'short'"),
    (EnvStep(observation=7), r"observation of type int"),
    (EnvStep(observation="x"), r"observation 'x' cannot be tokenized"),
])
def test_errors_name_environment_episode_turn_and_step(result, match):
    with pytest.raises(EpisodeError, match=match):
        _sample(lambda: _Bad(result), step=5)


@pytest.mark.parametrize("timeout", [None, 2.0])  # called in this thread, or in the pool
def test_an_environment_that_exits_is_named_and_does_not_end_the_process(timeout):
    class Exits(Environment):
        def step(self, completion):
            raise SystemExit(0)

    with pytest.raises(EpisodeError, match=r"episode 0 .*turn 1: step\(\) called sys.exit\(0\) \(SystemExit\)"):
        _sample(Exits, timeout=timeout)


def test_env_timeout_names_the_call():
    class Slow(Environment):
        def step(self, completion):
            time.sleep(5)

    t0 = time.monotonic()
    with pytest.raises(EpisodeError, match=r"episode 0 .*turn 1: step\(\) did not return within --env-timeout 0.2s"):
        _sample(Slow, timeout=0.2)
    assert time.monotonic() - t0 < 4


def test_async_timeout():
    class SlowAsync(Environment):
        async def step(self, completion):
            await asyncio.sleep(5)

    with pytest.raises(EpisodeError, match=r"step\(\) did not return within --env-timeout 0.2s"):
        _sample(SlowAsync, timeout=0.2)
