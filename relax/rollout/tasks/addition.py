"""The built-in multi-reward task: single-digit addition with tagged answers.

Prompt ``<bos>a+b=`` with a, b in 0..9 (label ``a + b``); the ideal completion is
``<a>`` + the digits of a + b + ``</a><eos>`` (4 or 5 tokens; at most 8 are sampled).

**Held-out split.** 20 of the 100 problems are held out for evaluation (``held_out_problems``): for
each first operand a, the two second operands b = 3a + 1 and 3a + 6 (mod 10), so every digit appears
twice as a and twice as b and 9 of the 20 answers have two digits (45 of 100 overall). The training
stream (``AdditionPrompts``) never draws them: it draws from the other 80 only.

Reward components, each in [0, 1]. The completion is read as tokens (``TinyTokenizer.encode``);
anything after the first ``<eos>`` is ignored, and ``len`` counts the tokens up to and including that
``<eos>`` (or all tokens when there is none):

- ``correct`` — 1 if the first run of consecutive digits equals the answer's decimal digits exactly
  (``"07"`` is not ``7``); tags are not required, so the components vary independently.
- ``digits`` — right-aligned fraction of the answer's digits that the first digit run gets right
  (answer ``12``, run ``2`` -> 0.5; run ``32`` -> 0.5; run ``112`` -> 1.0); 0 without digits.
- ``format`` — 1/4 each for: the completion opens with ``<a>``; a ``</a>`` follows (after the first
  ``<a>``, or anywhere when there is no ``<a>``); the tokens between them are one or more digits only
  (an empty answer ``<a></a>`` does not count); ``<eos>`` comes right after that ``</a>``.
- ``length`` — 0 without ``<eos>``, else ``max(0, 1 - |len - ideal| / ideal)`` with
  ``ideal = digits(answer) + 3``.

Extra components for the GDPO worked example (select them with ``make_reward_fn(components)`` or the
registered tasks ``addition-brevity`` / ``addition-judge``):

- ``brevity`` — ``1 - len / 8`` if the completion stops, else 0 (conflicts with two-digit answers when
  weighted heavily).
- ``judge`` — a reproducible fair coin, 0 or 1, independent of quality: the first bit of
  SHA-256 over ``metadata["seed"]``, ``metadata["index"]``, ``metadata.get("sample_index")``, the
  prompt and the completion. ``AdditionPrompts`` puts ``seed`` and ``index`` (the position in the
  stream) in every prompt's metadata, so two draws of the same problem get independent coins; a
  caller that wants identical completions within one group to get independent coins adds
  ``sample_index`` to the metadata it passes.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from relax.models.tiny.tokenizer import TinyTokenizer
from relax.rollout.base import Prompt, SamplingParams

if TYPE_CHECKING:
    from relax.rollout.tasks.task import Task

MAX_NEW_TOKENS = 8
BASE_COMPONENTS: tuple[str, ...] = ("correct", "digits", "format", "length")
EXTRA_COMPONENTS: tuple[str, ...] = ("brevity", "judge")

_TOKENIZER = TinyTokenizer()


def prompt_text(a: int, b: int) -> str:
    return f"<bos>{a}+{b}="


def target_text(a: int, b: int) -> str:
    """The ideal completion."""
    return f"<a>{a + b}</a><eos>"


def all_problems() -> list[Prompt]:
    """The 100 problems in order (held-out and training problems alike)."""
    return [Prompt(prompt_text(a, b), a + b, {"a": a, "b": b}) for a in range(10) for b in range(10)]


# (a, b) of the held-out problems: b = 3a + 1 and 3a + 6 (mod 10) for each a (see the module docstring).
HELD_OUT: frozenset[tuple[int, int]] = frozenset(
    (a, (3 * a + shift) % 10) for a in range(10) for shift in (1, 6)
)


def held_out_problems() -> list[Prompt]:
    """The 20 held-out problems, in (a, b) order: the evaluation set of the built-in addition tasks."""
    return [
        Prompt(prompt_text(a, b), a + b, {"a": a, "b": b, "split": "eval", "index": i})
        for i, (a, b) in enumerate(sorted(HELD_OUT))
    ]


class AdditionPrompts:
    """A seeded, resumable stream of the training problems (never a ``HELD_OUT`` one).

    Prompt number k depends only on ``(seed, k)``, so restoring ``state_dict()`` (the seed and the
    counter) continues exactly the same stream. Each prompt draws (a, b) uniformly and draws again
    while the pair is held out: uniform over the 80 training problems.
    """

    def __init__(self, seed: int = 0, *, max_operand: int = 9):
        if not 0 <= max_operand <= 9:
            raise ValueError(f"max_operand must be in 0..9 (single-digit operands), got {max_operand}")
        self.seed = int(seed)
        self.max_operand = max_operand
        self.counter = 0

    def problem(self, index: int) -> Prompt:
        # str seeds are hashed with SHA-512 by random.Random: stable across processes and runs.
        rng = random.Random(f"relax-addition:{self.seed}:{index}")
        a, b = rng.randint(0, self.max_operand), rng.randint(0, self.max_operand)
        while (a, b) in HELD_OUT:  # (0, 0) is never held out, so this ends for every max_operand
            a, b = rng.randint(0, self.max_operand), rng.randint(0, self.max_operand)
        return Prompt(prompt_text(a, b), a + b, {"seed": self.seed, "index": index, "a": a, "b": b})

    def next_batch(self, n: int) -> list[Prompt]:
        prompts = [self.problem(self.counter + i) for i in range(n)]
        self.counter += n
        return prompts

    def __iter__(self):
        return self

    def __next__(self) -> Prompt:
        return self.next_batch(1)[0]

    def state_dict(self) -> dict:
        return {"seed": self.seed, "counter": self.counter, "max_operand": self.max_operand}

    def load_state_dict(self, state: Mapping) -> None:
        self.seed, self.counter = int(state["seed"]), int(state["counter"])
        self.max_operand = int(state.get("max_operand", self.max_operand))


# -- reward ---------------------------------------------------------------------------------------


def _answer_digits(label: Any) -> str:
    if isinstance(label, bool) or not isinstance(label, (int, str)) or not str(label).isdigit():
        raise ValueError(f"the addition task needs a non-negative integer label, got {label!r}")
    return str(int(label))


def _first_digit_run(tokens: Sequence[int]) -> str:
    run = []
    for t in tokens:
        if _TOKENIZER.is_digit(t):
            run.append(str(_TOKENIZER.digit_value(t)))
        elif run:
            break
    return "".join(run)


def _format_score(tokens: Sequence[int]) -> float:
    tk = _TOKENIZER
    opens = tokens[0] == tk.open_id if tokens else False
    start = tokens.index(tk.open_id) + 1 if tk.open_id in tokens else 0
    close = next((i for i in range(start, len(tokens)) if tokens[i] == tk.close_id), None)
    if close is None:
        return 0.25 * opens
    inside = tokens[start:close]
    digits_only = len(inside) > 0 and all(tk.is_digit(t) for t in inside)
    eos_after = close + 1 < len(tokens) and tokens[close + 1] == tk.eos_id
    return 0.25 * (opens + 1 + digits_only + eos_after)


def _judge_coin(prompt: str, completion: str, metadata: Mapping) -> float:
    key = "\x1f".join(
        str(x) for x in (metadata.get("seed"), metadata.get("index"), metadata.get("sample_index"), prompt, completion)
    )
    return float(hashlib.sha256(key.encode()).digest()[0] & 1)


def score_components(
    prompt: str, completion: str, label: Any, metadata: Mapping, components: Iterable[str] = BASE_COMPONENTS
) -> dict[str, float]:
    """Every requested component of one completion (see the module docstring)."""
    answer = _answer_digits(label)
    tokens = _TOKENIZER.encode(completion)
    stopped = _TOKENIZER.eos_id in tokens
    if stopped:
        tokens = tokens[: tokens.index(_TOKENIZER.eos_id) + 1]
    n = len(tokens)
    run = _first_digit_run(tokens)
    ideal = len(answer) + 3
    out: dict[str, float] = {}
    for name in components:
        if name == "correct":
            out[name] = float(run == answer)
        elif name == "digits":
            hits = sum(1 for i in range(1, len(answer) + 1) if i <= len(run) and run[-i] == answer[-i])
            out[name] = hits / len(answer)
        elif name == "format":
            out[name] = _format_score(tokens)
        elif name == "length":
            out[name] = max(0.0, 1.0 - abs(n - ideal) / ideal) if stopped else 0.0
        elif name == "brevity":
            out[name] = max(0.0, 1.0 - n / MAX_NEW_TOKENS) if stopped else 0.0
        elif name == "judge":
            out[name] = _judge_coin(prompt, completion, metadata)
        else:
            raise KeyError(
                f"unknown addition reward component {name!r}; choose from "
                f"{', '.join(BASE_COMPONENTS + EXTRA_COMPONENTS)}"
            )
    return out


def make_reward_fn(components: Sequence[str] = BASE_COMPONENTS):
    """A reward function with the standard signature returning the chosen components."""
    components = tuple(components)
    score_components("<bos>1+1=", "", 2, {}, components)  # fail now on an unknown name

    def addition_reward(prompt: str, completion: str, label: Any, metadata: Mapping) -> dict[str, float]:
        return score_components(prompt, completion, label, metadata, components)

    addition_reward.components = components
    addition_reward.__qualname__ = f"addition_reward[{','.join(components)}]"
    return addition_reward


addition_reward = make_reward_fn(BASE_COMPONENTS)


def greedy_accuracy(engine, task: Task, problems: Sequence[Prompt] | None = None) -> float:
    """Fraction of ``problems`` (default: all 100 addition problems) whose greedy answer scores
    ``correct`` = 1 under ``task.reward_fn``."""
    if "correct" not in task.reward_keys:
        raise ValueError(
            f"greedy_accuracy scores the 'correct' component; task {task.name!r} has {task.reward_keys}"
        )
    problems = list(all_problems() if problems is None else problems)
    tok = engine.tokenizer
    params = SamplingParams(temperature=0.0, max_new_tokens=task.max_new_tokens)
    gen = engine.generate([tok.encode(p.text) for p in problems], params)
    texts = engine.decode_responses(gen)
    hits = sum(task.reward_fn(p.text, c, p.label, p.metadata)["correct"] for p, c in zip(problems, texts))
    return hits / len(problems)
