"""``--task reasoning-gym:<dataset>``: procedural tasks from the ``reasoning-gym`` package.

reasoning-gym (the ``rewards`` extra, ``reasoning-gym==0.1.25``) generates problems with their own
scorers; nothing is downloaded, every problem is a pure function of ``(dataset, seed, index)``. A
reasoning-gym task is a prompt source and a reward for a Hugging Face model (``--hf-checkpoint``):

- **prompts**: the problem's question plus ``INSTRUCTION`` (answer inside ``<answer> </answer>``),
  formatted like ``--prompt-data`` rows: ``--prompt-suffix``, then with ``--apply-chat-template`` the
  user message of the chat template (``--system-prompt`` as its system message);
- **labels**: the dataset's answer; the metadata names ``dataset``, ``seed`` and ``index``, so the
  reward regenerates the problem exactly instead of shipping reasoning-gym's own metadata around;
- **reward components**: ``score``, the dataset's own ``score_answer`` of the text inside the first
  ``<answer>...</answer>`` (in [0, 1]; some datasets give partial credit), and ``has_answer``
  (1.0 when the completion has the tags at all);
- **held-out split by seed**: problems ``0 .. HELD_OUT - 1`` of the run's ``--seed`` are the
  evaluation set; the training stream draws problems ``HELD_OUT, HELD_OUT + 1, ...`` of the same seed
  and skips any whose question is also a held-out question (small datasets repeat questions).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from relax.rollout.base import Prompt

PREFIX = "reasoning-gym:"
REWARD_KEYS = ("score", "has_answer")
HELD_OUT = 32  # evaluation problems
DATASET_SIZE = 10**9  # reasoning-gym needs a size; problems are generated on access
INSTRUCTION = "\n\nGive only your final answer, inside <answer> </answer> tags."
MAX_NEW_TOKENS = 64


def _reasoning_gym():
    try:
        import reasoning_gym
    except ImportError:
        raise ImportError(
            "--task reasoning-gym:<dataset> needs reasoning-gym: pip install -e '.[rewards]' torch==2.13.0 "
            "(reasoning-gym==0.1.25)"
        ) from None
    return reasoning_gym


def dataset_names() -> tuple[str, ...]:
    return tuple(sorted(_reasoning_gym().factory.DATASETS))


@functools.lru_cache(maxsize=64)
def dataset(name: str, seed: int):
    """The reasoning-gym dataset ``name`` with ``seed`` (cached: scoring regenerates problems)."""
    rg = _reasoning_gym()
    if name not in rg.factory.DATASETS:
        raise KeyError(
            f"unknown reasoning-gym dataset {name!r} (--task {PREFIX}{name}); it has: "
            f"{', '.join(dataset_names())}"
        )
    return rg.create_dataset(name, size=DATASET_SIZE, seed=int(seed))


def entry(name: str, seed: int, index: int) -> Mapping[str, Any]:
    return dataset(name, seed)[int(index)]


def extract_answer(completion: str) -> str | None:
    return _reasoning_gym().utils.extract_answer(completion, tag_name="answer")


def reward(prompt: str, completion: str, label: Any, metadata: Mapping) -> dict[str, float]:
    """``{"score": the dataset's own score of the answer, "has_answer": 0/1}``."""
    try:
        name, seed, index = metadata["dataset"], metadata["seed"], metadata["index"]
    except (KeyError, TypeError):
        raise ValueError(
            f"the reasoning-gym reward needs metadata with 'dataset', 'seed' and 'index' (a prompt of "
            f"--task {PREFIX}<dataset>), got {metadata!r:.120}"
        ) from None
    problem = entry(name, seed, index)
    answer = extract_answer(completion)
    score = dataset(name, seed).score_answer(answer, problem)
    return {"score": float(score), "has_answer": float(answer is not None)}


class PromptFormat:
    """The run's prompt formatting (``--prompt-suffix``, ``--apply-chat-template``, ``--system-prompt``),
    applied to a question as ``--prompt-data`` applies it to a row's text."""

    def __init__(self, config, tokenizer):
        self.suffix = config.prompt_suffix or ""
        self.chat = bool(config.apply_chat_template)
        self.system = config.system_prompt
        self.tokenizer = tokenizer
        if self.system is not None and not self.chat:
            raise ValueError("--system-prompt needs --apply-chat-template (a system message only exists "
                             "in a chat template)")
        if self.chat and not callable(getattr(tokenizer, "apply_chat_template", None)):
            raise ValueError(f"--apply-chat-template: the tokenizer ({type(tokenizer).__name__}) has no chat "
                             "template; drop the flag or use an --hf-checkpoint that has one")

    def __call__(self, question: str) -> str:
        text = question + INSTRUCTION + self.suffix
        if not self.chat:
            return text
        messages = [{"role": "user", "content": text}]
        if self.system is not None:
            messages.insert(0, {"role": "system", "content": self.system})
        return self.tokenizer.apply_chat_template(messages)


def _prompt(name: str, seed: int, index: int, fmt: PromptFormat, split: str) -> Prompt:
    problem = entry(name, seed, index)
    meta = {"dataset": name, "seed": int(seed), "index": int(index), "split": split}
    return Prompt(fmt(problem["question"]), problem["answer"], meta)


def held_out_questions(name: str, seed: int) -> frozenset[str]:
    return frozenset(entry(name, seed, i)["question"] for i in range(HELD_OUT))


class ReasoningGymPrompts:
    """The seeded, resumable training stream: problems ``HELD_OUT, HELD_OUT + 1, ...`` of ``seed``
    that are not held-out questions. The state is the next problem index."""

    def __init__(self, name: str, seed: int, fmt: PromptFormat):
        self.name, self.seed, self.fmt = name, int(seed), fmt
        self.next_index = HELD_OUT
        self._held_out = held_out_questions(name, self.seed)

    def next_batch(self, n: int) -> list[Prompt]:
        prompts = []
        skipped = 0
        while len(prompts) < n:
            index = self.next_index
            self.next_index += 1
            if entry(self.name, self.seed, index)["question"] in self._held_out:
                skipped += 1
                if skipped > 1000 * max(n, 1):
                    raise ValueError(f"--task {PREFIX}{self.name}: the dataset keeps repeating its "
                                     f"{HELD_OUT} held-out questions; it has too few distinct problems")
                continue
            prompts.append(_prompt(self.name, self.seed, index, self.fmt, "train"))
        return prompts

    def state_dict(self) -> dict:
        return {"dataset": self.name, "seed": self.seed, "next_index": self.next_index}

    def load_state_dict(self, state: Mapping) -> None:
        self.seed, self.next_index = int(state["seed"]), int(state["next_index"])
        self._held_out = held_out_questions(self.name, self.seed)


def make_task(name: str):
    """The ``Task`` of ``--task reasoning-gym:<name>`` (``KeyError`` for an unknown dataset)."""
    from relax.rollout.tasks.task import Task

    dataset(name, 0)  # an unknown name fails here, before Ray starts

    def no_tiny_engine():
        raise ValueError(f"--task {PREFIX}{name} needs --hf-checkpoint (a Hugging Face model): the built-in "
                         "tiny model's 17-token vocabulary cannot encode its questions")

    def unformatted(seed: int):
        raise ValueError(f"--task {PREFIX}{name} formats its prompts with the run's tokenizer; "
                         "build them with prompt_source(config, tokenizer)")

    return Task(
        name=f"{PREFIX}{name}",
        description=f"reasoning-gym's procedural {name!r} problems, scored by the dataset's own scorer",
        reward_keys=REWARD_KEYS,
        reward_fn=reward,
        make_prompts=unformatted,
        make_engine=no_tiny_engine,
        max_new_tokens=MAX_NEW_TOKENS,
        prompt_source=lambda config, tokenizer: ReasoningGymPrompts(name, config.seed,
                                                                    PromptFormat(config, tokenizer)),
        eval_prompts=lambda config, tokenizer: [
            _prompt(name, config.seed, i, PromptFormat(config, tokenizer), "eval") for i in range(HELD_OUT)
        ],
    )
