"""One rollout worker's share of an evaluation (``RolloutCore.evaluate``): its slice of the prompts,
the evaluation sampling parameters, its own generator, and which reward component decides pass/fail.
The driver's side (merging the slices, ``eval/*``) is ``relax.runtime.driver.evaluation``."""

from __future__ import annotations

import torch

from relax.rollout.base import SamplingParams
from relax.rollout.sampling import sample_groups
from relax.runtime.metrics.step_metrics import _jsonable

CORRECT = "correct"


def pass_component(config) -> str:
    """The reward component that decides pass/fail: ``--reward-key``, else ``correct`` when it is a
    reward key (the built-in tasks), else the first of ``--reward-keys``."""
    keys = tuple(config.algorithm.reward_keys)
    if config.reward_key:
        return config.reward_key
    return CORRECT if CORRECT in keys else keys[0]


def slice_bounds(count: int, workers: int, index: int) -> tuple[int, int]:
    """Worker ``index``'s contiguous share of ``count`` prompts (sizes differ by at most one)."""
    return count * index // workers, count * (index + 1) // workers


def eval_sampling_params(config) -> SamplingParams:
    return SamplingParams(
        temperature=config.eval_temperature,
        top_p=config.eval_top_p,
        max_new_tokens=config.eval_max_response_len or config.rollout_max_response_len,
    )


def eval_generator(seed: int, version: int, index: int) -> torch.Generator:
    """A generator of its own per evaluation and worker: the training generator is never touched."""
    return torch.Generator().manual_seed((seed * 1_000_003 + (version + 1) * 7_919 + index) % 2**63)


def sample_eval_slice(core, version: int) -> dict:
    """Generate and score this worker's slice of the evaluation prompts with the engine's current
    weights. ``core``: a ``RolloutCore`` (engine, tokenizer, reward function, evaluation prompts)."""
    cfg, keys = core.config, core.reward_keys
    n = cfg.eval_n_samples_per_prompt
    prompts = core.eval_prompts()
    lo, hi = slice_bounds(len(prompts), core.num_workers, core.index)
    mine = prompts[lo:hi]
    report = {"n": n, "prompts": len(mine), "rewards": torch.zeros(0, len(keys)), "lengths": [],
              "completions": [], "generate_s": 0.0}
    if not mine:
        return report
    scored = sample_groups(core.engine, mine, n, eval_sampling_params(cfg),
                           generator=eval_generator(cfg.seed, version, core.index), reward_fn=core.reward_fn,
                           reward_keys=keys, concurrency=cfg.reward_concurrency,
                           episodes=getattr(core, "episodes", None))  # --env-path: evaluation episodes
    texts, completions, labels = scored.texts, scored.completions, scored.labels
    report["generate_s"] = scored.generate_s
    report["rewards"] = scored.rewards
    report["lengths"] = scored.batch.response_mask.sum(1).tolist()
    limit = min(-(-cfg.log_completions // core.num_workers), len(completions))  # --log-completions
    report["completions"] = [
        {"policy_version": int(version), "prompt": texts[i], "completion": completions[i],
         "label": _jsonable(labels[i]),
         "rewards": {key: float(report["rewards"][i, j]) for j, key in enumerate(keys)},
         "normalized_reward": None}
        for i in range(limit)
    ]
    return report
