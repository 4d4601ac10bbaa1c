"""``Task``: what a built-in task is made of (its prompts, reward function and keys, tokenizer and
engine, held-out problems, environment). The tasks themselves are listed in ``relax.rollout.tasks``."""

from __future__ import annotations

from collections.abc import Callable

import attrs

from relax.models.tiny.tokenizer import TinyTokenizer
from relax.rollout.tasks import addition


def _warmup_engine():
    from relax.models.tiny.weights import load_warmup_model
    from relax.rollout.tiny.engine import TinyEngine

    return TinyEngine(load_warmup_model())


@attrs.frozen(kw_only=True)
class Task:
    name: str
    description: str
    reward_keys: tuple[str, ...]
    reward_fn: Callable  # (prompt, completion, label, metadata) -> {component: float}
    make_prompts: Callable[[int], object]  # seed -> a resumable prompt source (next_batch, state_dict)
    make_tokenizer: Callable[[], TinyTokenizer] = TinyTokenizer
    make_engine: Callable[[], object] = _warmup_engine  # the warm-up model in a TinyEngine
    max_new_tokens: int = addition.MAX_NEW_TOKENS
    # The evaluation set: problems the training stream never draws (None: the task has none).
    held_out: Callable[[], list] | None = None
    # A multi-turn task's environment class (relax.rollout.environments); None: single-turn.
    make_env: Callable[[], object] | None = None
    # A task for Hugging Face models (--hf-checkpoint), whose prompts are formatted with the run's
    # tokenizer and flags: (config, tokenizer) -> prompt source / evaluation prompts. When set, they
    # replace make_prompts / held_out (relax.rollout.factory).
    prompt_source: Callable[[object, object], object] | None = None
    eval_prompts: Callable[[object, object], list] | None = None

    @property
    def needs_hf_checkpoint(self) -> bool:
        return self.prompt_source is not None
