"""The one sampling function: prompt groups -> completions -> decoded texts -> reward matrix.

The rollout worker (training, on Ray or in one process), the evaluation and the recipes all sample through
``sample_groups``, so a completion is generated, decoded and scored the same way wherever it is
used. Rows are group-major: the ``n`` samples of prompt 0 first, then those of prompt 1, ...; each
row's metadata carries ``sample_index`` (its position in its group), so a reward function can give
identical completions of one group independent judge coins, and ``response_tokens`` /
``max_response_tokens`` (the generated token count and ``--rollout-max-response-len``), for rewards
that depend on the length in tokens.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import torch

from relax.rollout.base import Generation, GenerationEngine, Prompt, SamplingParams
from relax.rollout.reward_services import CombinedRewards
from relax.rollout.rewards import score


@attrs.frozen(kw_only=True)
class ScoredGroups:
    """One sampling round: ``P`` prompts x ``n`` samples = ``N`` rows, group-major."""

    generation: Generation  # tokens (TokenBatch) and the engine's behaviour log-probs [N, T]
    owner: torch.Tensor  # int64 [N]: each row's prompt index 0..P-1
    texts: list[str]  # each row's prompt text
    completions: list[str]
    labels: list[Any]
    metadata: list[dict]
    rewards: torch.Tensor  # float64 [N, K], columns in reward_keys order
    generate_s: float
    reward_s: float
    # Multi-turn rounds only (relax.rollout.environments): episode, turn, tool-call, token and
    # environment-time totals for the rollout/turns_mean etc. metrics; empty for single-turn rounds.
    episode_stats: Mapping[str, float] = attrs.field(factory=dict)

    @property
    def batch(self):
        return self.generation.batch

    def samples(self) -> list[dict]:
        """The rows as the user hooks see them: prompt, completion, label, metadata."""
        return [
            {"prompt": p, "completion": c, "label": lab, "metadata": m}
            for p, c, lab, m in zip(self.texts, self.completions, self.labels, self.metadata)
        ]


def sample_groups(
    engine: GenerationEngine,
    prompts: Sequence[Prompt],
    n: int,
    params: SamplingParams,
    *,
    generator: torch.Generator | None,
    reward_fn,
    reward_keys: Sequence[str],
    concurrency: int = 1,
    episodes=None,
) -> ScoredGroups:
    """Sample ``n`` completions for each prompt with ``engine`` and score them with ``reward_fn``.

    With ``episodes`` (an ``relax.rollout.environments.EpisodeRunner``, ``--env-path``) each sample
    is a multi-turn episode instead, scored by its environment's rewards (``reward_fn`` unused)."""
    # -- multi-turn (--env-path): the turn loop returns the same ScoredGroups --
    if episodes is not None:
        return episodes.sample(engine, prompts, n, params, generator=generator, reward_keys=reward_keys)
    # -- end multi-turn --
    ids = [engine.tokenizer.encode(p.text) for p in prompts]
    owner = torch.arange(len(prompts)).repeat_interleave(n)
    rows = owner.tolist()
    t0 = time.perf_counter()
    generation = engine.generate([ids[g] for g in rows], params, generator=generator)
    t1 = time.perf_counter()
    completions = engine.decode_responses(generation)
    texts = [prompts[g].text for g in rows]
    labels = [prompts[g].label for g in rows]
    # the generated token count and the limit, for length-aware rewards (relax.rewards.overlong)
    lengths = generation.batch.response_mask.sum(1).tolist()
    metadata = [{**prompts[g].metadata, "sample_index": j % n, "response_tokens": int(lengths[j]),
                 "max_response_tokens": params.max_new_tokens} for j, g in enumerate(rows)]
    if isinstance(reward_fn, CombinedRewards):  # --reward-model-path / --judge-model-path: services too
        rewards = reward_fn.matrix(texts, completions, labels, metadata, concurrency)
    else:
        rewards = score(reward_fn, texts, completions, labels, metadata, reward_keys, concurrency)
    t2 = time.perf_counter()
    return ScoredGroups(
        generation=generation, owner=owner, texts=texts, completions=completions, labels=labels,
        metadata=metadata, rewards=rewards, generate_s=t1 - t0, reward_s=t2 - t1,
    )
