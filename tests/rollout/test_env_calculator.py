"""The built-in ``calculator`` task: vocabulary, tool, environment, checkpoint and the sampled episode."""

from __future__ import annotations

import torch

from relax.config.run import RunConfig
from relax.models.tiny.calculator import VOCAB, CalculatorTokenizer, load_calculator_model
from relax.models.tiny.tokenizer import TinyTokenizer
from relax.rollout.base import SamplingParams
from relax.rollout.environments import episode_runner, is_multi_turn
from relax.rollout.environments.preflight import check_environment
from relax.rollout.sampling import sample_groups
from relax.rollout.tasks import get_task
from relax.rollout.tasks.calculator import HELD_OUT, CalculatorEnv, CalculatorPrompts, calculate, score_answer


def test_vocabulary_extends_the_addition_one_without_moving_its_ids():
    tok, base = CalculatorTokenizer(), TinyTokenizer()
    assert VOCAB[: base.vocab_size] == base.vocab and tok.vocab_size == 21
    text = "<calc>34+58</calc><eos><r>92</r><a>92</a><eos>"
    assert tok.decode(tok.encode(text)) == text
    assert tok.encode("<bos>3+4=") == base.encode("<bos>3+4=")


def test_calculator_and_answer_scoring():
    assert calculate("34+58") == 92
    for bad in ("34+", "3*4", "1234+1"):
        try:
            calculate(bad)
        except ValueError:
            continue
        raise AssertionError(bad)
    assert score_answer("", "<a>92</a><eos>", 92, {}) == {"correct": 1.0}
    assert score_answer("", "<a>29</a><eos>", 92, {}) == {"correct": 0.0}


def _env(a=34, b=58):
    env = CalculatorEnv()
    env.reset({"prompt": f"<bos>{a}+{b}=", "label": a + b, "metadata": {"a": a, "b": b}})
    return env


def test_the_ideal_episode_and_a_bad_call():
    env = _env()
    call = env.step("<calc>34+58</calc><eos>")
    assert (call.observation, call.done, call.info) == ("<r>92</r>", False, {"tool_calls": 1})
    answer = env.step("<a>92</a><eos>")
    assert answer.done and answer.rewards == {"correct": 1.0}
    bad = _env().step("<calc>34+</calc><eos>")
    assert bad.observation == "<r></r>" and "cannot evaluate" in bad.info["tool_error"]
    direct = _env().step("<a>91</a><eos>")
    assert direct.done and direct.rewards == {"correct": 0.0}


def test_prompts_never_draw_held_out_problems_and_resume():
    stream = CalculatorPrompts(3)
    first = stream.next_batch(50)
    assert all((p.metadata["a"], p.metadata["b"]) not in HELD_OUT for p in first)
    state = stream.state_dict()
    again = CalculatorPrompts(0)
    again.load_state_dict(state)
    assert again.next_batch(2) == stream.next_batch(2)
    assert len(HELD_OUT) == 90 and {a for a, _ in HELD_OUT} == {b for _, b in HELD_OUT} == set(range(10, 100))


def test_task_brings_its_environment_and_model():
    config = RunConfig(task="calculator")
    assert is_multi_turn(config) and not is_multi_turn(RunConfig())
    runner = episode_runner(config)
    assert runner.make_env is CalculatorEnv and runner.max_turns == 4
    task = get_task("calculator")
    check_environment(config, [("task prompt 0", task.make_prompts(0).next_batch(1)[0])])
    engine = task.make_engine()
    assert engine.model.config.vocab_size == 21 and engine.model.config.max_seq_len == 32
    scored = sample_groups(engine, task.make_prompts(0).next_batch(16), 2, SamplingParams(max_new_tokens=8),
                           generator=torch.Generator().manual_seed(0), reward_fn=None, reward_keys=("correct",),
                           episodes=runner)
    called = [m for m in scored.metadata if any(i.get("tool_calls") for i in m["env_info"])]
    # the warm-up model calls the tool in some episodes (and then answers), answers at once in others
    assert 0 < len(called) < 32
    assert all([t["role"] for t in m["turns"]][:3] == ["assistant", "environment", "assistant"] for m in called)


def test_shipped_checkpoint_records_its_base_rates():
    from relax.models.tiny.calculator import CHECKPOINT

    rates = torch.load(CHECKPOINT, weights_only=True)["base_rates"]
    # the model can hardly answer right on its own, and calls the tool in a minority of episodes
    assert rates["correct"] < 0.05 and 0.05 < rates["tool_call_share"] < 0.3
    assert load_calculator_model().config.vocab_size == 21
