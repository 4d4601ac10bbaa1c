"""The turn loop: prompt groups -> episodes of alternating model and environment turns -> the same
``ScoredGroups`` the single-turn sampler returns (so filters, reward stage, data plane, evaluation
and metrics work unchanged).

Every live episode's next model turn is generated in one ``engine.generate`` batch whose prompts are
the episodes' tokens so far; then every live episode's environment steps (``EnvCaller``). An episode
ends when its environment says ``done``, after ``--max-turns`` model turns, or when the model's
context is full. Its response is all tokens after the prompt: model tokens are in the loss mask
(``response_mask``) with their behaviour log-probs, environment tokens only in
``response_attention_mask`` (log-prob 0). See ``relax.models.batch``.
"""

from __future__ import annotations

import math
import numbers
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import torch

from relax.models.batch import TokenBatch
from relax.rollout.base import Generation, Prompt, SamplingParams
from relax.rollout.environments.base import EnvStep
from relax.rollout.environments.calls import EnvCaller, EpisodeError, raised
from relax.rollout.environments.turns import TurnFormat, context_limit
from relax.rollout.sampling import ScoredGroups


class _Episode:
    def __init__(self, prompt_ids: list[int]):
        self.prompt_ids = prompt_ids
        self.ids: list[int] = []
        self.loss: list[bool] = []
        self.log_probs: list[float] = []
        self.turns: list[dict] = []  # {"role": "assistant" | "environment", "text": ...}
        self.infos: list = []
        self.rewards: dict[str, float] = {}
        self.done = False
        self.ended_by_env = False
        self.model_turns = 0
        self.tool_calls = 0

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.ids)

    def add(self, ids: Sequence[int], log_probs: Sequence[float] | None):
        self.ids += ids
        self.loss += [log_probs is not None] * len(ids)
        self.log_probs += log_probs if log_probs is not None else [0.0] * len(ids)


@attrs.frozen(kw_only=True)
class EpisodeRunner:
    """What ``--env-path`` / ``--max-turns`` / ``--env-timeout`` configure; ``sample`` is the turn
    loop. ``at_step(step)`` gives the same runner naming that training step in its errors."""

    make_env: Callable[[], Any]
    env_name: str
    max_turns: int
    timeout: float | None = None
    step: int | None = None

    def at_step(self, step: int | None) -> EpisodeRunner:
        return attrs.evolve(self, step=step)

    def sample(self, engine, prompts: Sequence[Prompt], n: int, params: SamplingParams, *,
               generator: torch.Generator | None, reward_keys: Sequence[str]) -> ScoredGroups:
        tokenizer = engine.tokenizer
        owner = torch.arange(len(prompts)).repeat_interleave(n)
        rows = owner.tolist()
        texts = [prompts[g].text for g in rows]
        labels = [prompts[g].label for g in rows]
        metadata = [{**prompts[g].metadata, "sample_index": j % n} for j, g in enumerate(rows)]
        prompt_ids = [tokenizer.encode(p.text) for p in prompts]
        episodes = [_Episode(prompt_ids[g]) for g in rows]
        caller = EnvCaller(self.env_name, self.timeout, lambda e: f"prompt {texts[e]!r}")
        caller.step = self.step
        fmt, limit = TurnFormat(tokenizer), context_limit(engine)
        generate_s = env_s = 0.0
        t0 = time.perf_counter()
        envs = [self._new_env(e) for e in range(len(episodes))]
        all_rows = list(range(len(episodes)))
        caller.call("reset", envs, all_rows,
                    [({"prompt": texts[e], "label": labels[e], "metadata": metadata[e]},) for e in all_rows], None)
        env_s += time.perf_counter() - t0
        try:
            for turn in range(1, self.max_turns + 1):
                live = [e for e in all_rows if not episodes[e].done]
                t1 = time.perf_counter()
                said = self._model_turn(engine, episodes, live, params, generator, limit, tokenizer)
                t2 = time.perf_counter()
                steps = caller.call("step", [envs[e] for e in said], list(said), [(c,) for c in said.values()], turn)
                for e, result in zip(said, steps):
                    self._apply(caller, episodes[e], e, turn, result, reward_keys, fmt, limit)
                env_s += time.perf_counter() - t2
                generate_s += t2 - t1
                if all(ep.done for ep in episodes):
                    break
        finally:
            caller.close()
        rewards = self._rewards(caller, episodes, reward_keys)
        for e, ep in enumerate(episodes):
            metadata[e]["turns"] = ep.turns
            if any(ep.infos):
                metadata[e]["env_info"] = ep.infos
        generation = _assemble(episodes, tokenizer.pad_id)
        completions = ["".join(t["text"] for t in ep.turns if t.get("in_sequence", True)) for ep in episodes]
        stats = {
            "episodes": len(episodes), "turns": sum(ep.model_turns for ep in episodes),
            "tool_calls": sum(ep.tool_calls for ep in episodes),
            "env_tokens": sum(len(ep.loss) - sum(ep.loss) for ep in episodes),
            "response_tokens": sum(len(ep.loss) for ep in episodes), "env_s": env_s,
        }
        return ScoredGroups(generation=generation, owner=owner, texts=texts, completions=completions, labels=labels,
                            metadata=metadata, rewards=rewards, generate_s=generate_s, reward_s=env_s,
                            episode_stats=stats)

    def _new_env(self, episode: int):
        try:
            return self.make_env()
        except (Exception, SystemExit) as exc:
            raise EpisodeError(f"environment {self.env_name}, episode {episode}: building it {raised(exc)}") from exc

    @staticmethod
    def _model_turn(engine, episodes, live, params, generator, limit, tokenizer) -> dict[int, str]:
        """Generate the next turn of every live episode (one batch per distinct token budget, which
        differ only near the context limit); returns episode -> the turn's text."""
        by_budget: dict[int, list[int]] = {}
        for e in live:
            budget = params.max_new_tokens if limit is None else min(params.max_new_tokens, limit - episodes[e].length)
            if budget < 1:
                episodes[e].done = True  # the context is full
            else:
                by_budget.setdefault(budget, []).append(e)
        said: dict[int, str] = {}
        for budget, group in by_budget.items():
            turn_params = attrs.evolve(params, max_new_tokens=budget)
            gen = engine.generate([episodes[e].prompt_ids + episodes[e].ids for e in group], turn_params,
                                  generator=generator)
            ids, mask, lps = gen.batch.response_ids.tolist(), gen.batch.response_mask.tolist(), gen.log_probs.tolist()
            for row, e in enumerate(group):
                tokens = [t for t, m in zip(ids[row], mask[row]) if m]
                episodes[e].add(tokens, [lp for lp, m in zip(lps[row], mask[row]) if m])
                episodes[e].model_turns += 1
                said[e] = tokenizer.decode(tokens)
                episodes[e].turns.append({"role": "assistant", "text": said[e]})
        return dict(sorted(said.items()))

    def _apply(self, caller, ep: _Episode, e: int, turn: int, result, reward_keys, fmt, limit):
        where = caller.where(e, turn, "step")
        if not isinstance(result, EnvStep):
            raise EpisodeError(f"{where} returned {type(result).__name__}; it must return "
                               "relax.rollout.EnvStep(observation=..., done=..., rewards=..., info=...)")
        if result.observation is not None and not isinstance(result.observation, str):
            raise EpisodeError(f"{where} returned observation of type {type(result.observation).__name__}; "
                               "it must be text or None")
        for key, value in (result.rewards or {}).items():
            ep.rewards[key] = ep.rewards.get(key, 0.0) + _reward_value(where, key, value)
        ep.infos.append(dict(result.info) if result.info else {})
        calls = (result.info or {}).get("tool_calls", 0)
        ep.tool_calls += int(calls) if isinstance(calls, numbers.Integral) else 0
        if result.done:
            ep.done = ep.ended_by_env = True
        elif turn == self.max_turns:
            ep.done = True
        if result.observation is None:
            return
        if ep.done:  # the episode is over: the observation is logged, not part of the sequence
            ep.turns.append({"role": "environment", "text": result.observation, "in_sequence": False})
            return
        try:
            ids = fmt.observation_ids(result.observation, ep.ids[-1] if ep.ids else None)
        except Exception as exc:
            raise EpisodeError(f"{where}: its observation {result.observation!r} cannot be tokenized: {exc}") from exc
        if limit is not None and ep.length + len(ids) >= limit:
            ids = ids[: max(0, limit - ep.length - 1)]  # keep one position for the model's answer
        ep.add(ids, None)
        ep.turns.append({"role": "environment", "text": result.observation})

    def _rewards(self, caller, episodes, reward_keys) -> torch.Tensor:
        rows = []
        for e, ep in enumerate(episodes):
            missing = [k for k in reward_keys if k not in ep.rewards]
            if missing and ep.ended_by_env:
                got = ", ".join(ep.rewards) or "none"
                raise EpisodeError(
                    f"{caller.where(e, None, 'step')}: the episode ended without reward component(s) "
                    f"{', '.join(map(repr, missing))} (its steps reported: {got}); the configured reward keys "
                    f"are {', '.join(reward_keys)} (--reward-keys)")
            rows.append([ep.rewards.get(k, 0.0) for k in reward_keys])
        return torch.tensor(rows, dtype=torch.float64).reshape(len(rows), len(reward_keys))


def _reward_value(where: str, key, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise EpisodeError(f"{where} returned reward {key!r} = {value!r} of type {type(value).__name__}; "
                           "expected a real number")
    number = float(value)
    if not math.isfinite(number) or abs(number) > float(torch.finfo(torch.float32).max):
        raise EpisodeError(f"{where} returned reward {key!r} = {value!r}, which is not a finite float32 "
                           "number; fix the environment (relax never replaces NaN/inf)")
    return number


def _assemble(episodes: Sequence[_Episode], pad_id: int) -> Generation:
    """Left-padded prompts, right-padded responses, the two masks and the behaviour log-probs."""
    n = len(episodes)
    p = max(len(ep.prompt_ids) for ep in episodes)
    t = max(1, max(len(ep.ids) for ep in episodes))
    prompt_ids = torch.full((n, p), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((n, p), dtype=torch.bool)
    response_ids = torch.full((n, t), pad_id, dtype=torch.long)
    loss = torch.zeros((n, t), dtype=torch.bool)
    attended = torch.zeros((n, t), dtype=torch.bool)
    log_probs = torch.zeros((n, t), dtype=torch.float32)
    for i, ep in enumerate(episodes):
        k, m = len(ep.prompt_ids), len(ep.ids)
        prompt_ids[i, p - k:] = torch.tensor(ep.prompt_ids, dtype=torch.long)
        prompt_mask[i, p - k:] = True
        if m:
            response_ids[i, :m] = torch.tensor(ep.ids, dtype=torch.long)
            loss[i, :m] = torch.tensor(ep.loss)
            attended[i, :m] = True
            log_probs[i, :m] = torch.tensor(ep.log_probs)
    batch = TokenBatch(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids,
                       response_mask=loss, response_attention_mask=attended)
    return Generation(batch=batch, log_probs=log_probs)


def episode_metrics(stats: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The step's multi-turn metrics from every sampling round's ``episode_stats`` (the environment
    time is a rollout time, ``time/rollout/env_s``, reported by each worker)."""
    total = {k: sum(s[k] for s in stats) for k in ("episodes", "turns", "tool_calls", "env_tokens",
                                                   "response_tokens")}
    episodes = max(total["episodes"], 1)
    return {
        "rollout/turns_mean": total["turns"] / episodes,
        "rollout/tool_calls_mean": total["tool_calls"] / episodes,
        "rollout/env_token_frac": total["env_tokens"] / max(total["response_tokens"], 1),
    }
