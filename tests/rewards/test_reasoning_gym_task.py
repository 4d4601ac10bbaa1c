"""--task reasoning-gym:<dataset>: prompts, labels, the dataset's scorer, the held-out split, the rules."""

from __future__ import annotations

import attrs
import pytest

pytest.importorskip("reasoning_gym", reason="the rewards extra (reasoning-gym) is not installed")

from relax.config.run import RunConfig
from relax.rollout import factory
from relax.rollout.tasks import get_task, reasoning_gym

TASK = "reasoning-gym:chain_sum"


class ChatTokenizer:
    """Just enough of a tokenizer: a chat template that shows roles."""

    def apply_chat_template(self, messages):
        return "".join(f"[{m['role']}] {m['content']} " for m in messages) + "[assistant]"


def config(**overrides) -> RunConfig:
    return RunConfig(task=TASK, hf_checkpoint="/nonexistent-model", **overrides)


def test_task_reward_keys_and_scorer():
    task = get_task(TASK)
    assert task.reward_keys == ("score", "has_answer") and task.needs_hf_checkpoint
    prompt = factory.build_prompt_source(config(), ChatTokenizer()).next_batch(1)[0]
    right = f"<think>adding</think><answer>{prompt.label}</answer>"
    wrong = f"<answer>{int(prompt.label) + 1}</answer>"
    assert task.reward_fn(prompt.text, right, prompt.label, prompt.metadata) == {"score": 1.0, "has_answer": 1.0}
    assert task.reward_fn(prompt.text, wrong, prompt.label, prompt.metadata) == {"score": 0.0, "has_answer": 1.0}
    assert task.reward_fn(prompt.text, prompt.label, prompt.label, prompt.metadata) == {"score": 0.0, "has_answer": 0.0}
    with pytest.raises(ValueError, match="'dataset', 'seed' and 'index'"):
        task.reward_fn(prompt.text, right, prompt.label, {})


def test_prompts_are_the_question_formatted_like_prompt_data():
    seed = config().seed
    problem = reasoning_gym.entry("chain_sum", seed, reasoning_gym.HELD_OUT)
    plain = factory.build_prompt_source(config(), ChatTokenizer()).next_batch(1)[0]
    assert plain.text == problem["question"] + reasoning_gym.INSTRUCTION and plain.label == problem["answer"]
    assert plain.metadata == {"dataset": "chain_sum", "seed": seed, "index": reasoning_gym.HELD_OUT, "split": "train"}
    chat = factory.build_prompt_source(
        config(apply_chat_template=True, system_prompt="be brief", prompt_suffix=" Thanks."), ChatTokenizer()
    ).next_batch(1)[0]
    assert chat.text == (f"[system] be brief [user] {problem['question']}{reasoning_gym.INSTRUCTION} Thanks. "
                         "[assistant]")


def test_stream_is_seeded_resumable_and_never_draws_a_held_out_question():
    source = factory.build_prompt_source(config(seed=3), ChatTokenizer())
    first = source.next_batch(5)
    state = source.state_dict()
    rest = source.next_batch(5)
    again = factory.build_prompt_source(config(seed=3), ChatTokenizer())
    assert [p.text for p in again.next_batch(5)] == [p.text for p in first]
    again.load_state_dict(state)
    assert [p.text for p in again.next_batch(5)] == [p.text for p in rest]
    other_seed = factory.build_prompt_source(config(seed=4), ChatTokenizer()).next_batch(5)
    assert [p.text for p in other_seed] != [p.text for p in first]

    held_out = factory.build_eval_prompts(config(seed=3), ChatTokenizer())
    assert len(held_out) == reasoning_gym.HELD_OUT
    assert {p.metadata["split"] for p in held_out} == {"eval"}
    assert not {p.text for p in held_out} & {p.text for p in first + rest}


def test_small_dataset_skips_repeated_held_out_questions():
    # count_bits / coin_flip-like sets repeat questions; use a task with a tiny problem space
    name = "basic_arithmetic"
    held = reasoning_gym.held_out_questions(name, 0)
    stream = reasoning_gym.ReasoningGymPrompts(name, 0, lambda q: q + reasoning_gym.INSTRUCTION)
    drawn = stream.next_batch(200)
    assert not {p.text.removesuffix(reasoning_gym.INSTRUCTION) for p in drawn} & held


def test_evaluation_is_on_with_an_hf_checkpoint():
    assert factory.evaluation_source(config()) == "held-out"
    assert factory.evaluation_source(config(evaluate=False)) is None
    assert factory.evaluation_source(RunConfig(hf_checkpoint="/m")) is None  # the tiny task on a user model


def test_unknown_dataset_is_named():
    with pytest.raises(KeyError, match="unknown reasoning-gym dataset 'nope'.*chain_sum"):
        get_task("reasoning-gym:nope")


def test_rules_refuse_the_tiny_model_and_read_the_format_flags():
    from relax.algorithms import load_algorithm
    from relax.runtime.checks.validation import ConfigError, validate

    grpo = load_algorithm("grpo")
    base = attrs.evolve(RunConfig(), task=TASK, algorithm=attrs.evolve(RunConfig().algorithm,
                                                                       reward_keys=("score", "has_answer"),
                                                                       reward_weights=(1.0, 1.0)))
    with pytest.raises(ConfigError, match=r"--task reasoning-gym:chain_sum needs --hf-checkpoint"):
        validate(base, grpo)
    warnings = validate(attrs.evolve(base, hf_checkpoint="/m", apply_chat_template=True, prompt_suffix="!"), grpo)
    assert not [w for w in warnings if "--apply-chat-template" in w or "--prompt-suffix" in w], warnings
    warnings = validate(attrs.evolve(base, hf_checkpoint="/m", input_key="q"), grpo)
    assert any("--input-key has no effect" in w for w in warnings)
