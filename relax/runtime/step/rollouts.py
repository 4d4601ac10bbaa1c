"""One step's rollout reports, merged: the plan's input and the step's rollout metrics.

Every rollout worker reports its kept groups, its raw ``[n, K]`` rewards before the group filter and
its counts and timings. Merging in worker order (never in order of arrival) keeps a run with
several workers deterministic, and computing the reward statistics once on the concatenated
rewards gives exactly the numbers one worker would compute on the whole batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from relax.rollout.environments.episodes import episode_metrics
from relax.runtime.metrics.step_metrics import response_metrics, reward_metrics, service_metrics
from relax.runtime.step.schedule import StepPlan, plan_step

# What the training roles need of a rollout report to plan the step (the rest is the driver's).
STEP_SHAPE_KEYS = ("kept_uids", "group_tokens", "group_size")
OPTIONAL_STEP_SHAPE_KEYS = ("group_sequences",)  # only with --overlong-filter


def step_shape(report: dict) -> dict:
    """The part of a rollout report that the actor ranks and the critic receive."""
    return {key: report[key] for key in STEP_SHAPE_KEYS + OPTIONAL_STEP_SHAPE_KEYS if key in report}


def plan_from_rollouts(rolls: Sequence[dict], num_minibatches: int, world_size: int) -> StepPlan:
    """The step's mini-batch plan; every role derives the same one from the same reports."""
    uids = [u for r in rolls for u in r["kept_uids"]]
    tokens = [t for r in rolls for t in r["group_tokens"]]
    # --overlong-filter: the loss counts only the sequences that kept a token
    sequences = ([s for r in rolls for s in r["group_sequences"]]
                 if all("group_sequences" in r for r in rolls) else None)
    return plan_step(uids, tokens, rolls[0]["group_size"], num_minibatches, world_size, sequences)


def rollout_metrics(algorithm, rolls: Sequence[dict]) -> dict[str, float]:
    """The step's ``reward/*``, ``multi_reward/*`` (and the method's own) statistics over all
    workers' samples (every sampling round's), the group counts, the sampling rounds, response length
    and the slowest worker's timings."""
    rewards = torch.cat([r["raw_rewards"] for r in rolls])
    group_ids = torch.cat([r["group_ids"] for r in rolls])
    metrics = reward_metrics(algorithm, rewards, group_ids, algorithm.config.reward_keys)
    kept = sum(len(r["kept_uids"]) for r in rolls)
    groups = sum(r["samples"] for r in rolls) // rolls[0]["group_size"]
    generated = sum(r["generated_tokens"] for r in rolls)
    metrics.update({
        # Dynamic sampling (--max-sampling-rounds): the most rounds a worker drew, the groups trained
        # and the groups sampled but not trained (no signal, filtered out, or beyond the batch).
        "rollout/sampling_rounds": max(r.get("sampling_rounds", 1) for r in rolls),
        "rollout/groups_kept": kept,
        "rollout/groups_dropped": groups - kept,
        "rollout/response_len": generated / sum(r["samples"] for r in rolls),
        "rollout/generated_tokens": generated,
    })
    for key in rolls[0]["times"]:
        metrics[key] = max(r["times"][key] for r in rolls)
    peaks = [r["gpu_peak_mib"] for r in rolls if "gpu_peak_mib" in r]
    if peaks:  # the rollout workers that hold their engine on a GPU
        metrics["perf/rollout_gpu_peak_mib"] = max(peaks)
    # --reward-model-path / --judge-model-path: reward_model/batch_size_mean, reward_model/time_s, ...
    metrics.update(service_metrics([r["reward_services"] for r in rolls if r.get("reward_services")]))
    episodes = [s for r in rolls for s in r.get("episode_stats", ())]
    if episodes:  # multi-turn: rollout/turns_mean, tool_calls_mean, env_token_frac
        metrics.update(episode_metrics(episodes))
    metrics.update(response_metrics(rolls))  # length max, truncated share, tokens/s; --log-completions
    if all("overlong_filtered" in r for r in rolls):  # --overlong-filter: share of trained samples left out
        trained = kept * rolls[0]["group_size"]
        metrics["rollout/overlong_filtered_frac"] = sum(r["overlong_filtered"] for r in rolls) / max(trained, 1)
    return metrics
