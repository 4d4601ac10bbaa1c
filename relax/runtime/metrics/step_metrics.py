"""A step's metrics, computed where the step runs: the reward statistics (with the combined reward),
the always-on rollout health metrics (response length, truncation, tokens/s), the reward services'
call statistics, the ``--log-completions`` records and the GPU memory peak. Where they are written:
``relax.runtime.files.metrics_log``."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import torch


def reward_metrics(algorithm, rewards: torch.Tensor, group_ids: torch.Tensor, keys: Sequence[str]) -> dict[str, float]:
    """The step's reward statistics and diagnostics: ``algorithm.reward_diagnostics`` of the raw
    ``[N, K]`` rewards (``reward/<key>/{mean,std,zero_std_frac}``, ``multi_reward/*``, and what the
    method adds, e.g. GDPO's ``gdpo/<key>/adv_share``). ``keys`` names the columns of ``rewards``
    and must be the algorithm's ``reward_keys``.

    Call it on the *whole* rollout, before the group filter: the groups it drops are part of what
    ``zero_std_frac`` and ``multi_reward/gdpo_cancel_rate`` count. The advantages are computed later
    by another role, so ``advantage/*`` is not part of it.
    """
    if tuple(keys) != tuple(algorithm.config.reward_keys):
        raise ValueError(
            f"reward columns {tuple(keys)} differ from the algorithm's reward_keys "
            f"{tuple(algorithm.config.reward_keys)}"
        )
    metrics = algorithm.reward_diagnostics(rewards, group_ids)
    metrics.update(combined_reward_metrics(rewards, algorithm.config.reward_weights, keys))
    return metrics


COMBINED = "combined"


def combined_reward_metrics(rewards: torch.Tensor, weights: Sequence[float], keys: Sequence[str]) -> dict[str, float]:
    """``reward/combined/mean``: the mean over samples of the ``--reward-weights``-weighted sum of the
    components (float64). Left out when a component is itself named ``combined``."""
    if COMBINED in keys or rewards.numel() == 0:
        return {}
    matrix = rewards.double().reshape(rewards.shape[0], -1)
    combined = matrix @ torch.tensor(tuple(weights), dtype=torch.float64)
    return {f"reward/{COMBINED}/mean": float(combined.mean())}


# A row's sample completions (a list of records, ``--log-completions``): not a metric.
# ``MetricsLog`` leaves it out of metrics.jsonl; ``relax.runtime.files.trackers`` writes it to
# completions.jsonl and to the trackers.
COMPLETIONS_KEY = "_completions"


# The evaluation's sample completions (relax.runtime.driver.evaluation), kept out of metrics.jsonl the same way.
EVAL_COMPLETIONS_KEY = "_eval_completions"


def _jsonable(value):
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


def completion_records(config, prompts, completions, labels, rewards: torch.Tensor, keep: torch.Tensor,
                       normalized: torch.Tensor, version: int) -> list[dict]:
    """Up to ``--log-completions`` samples of one rollout worker (its first ones, whole prompt groups
    first; with several workers each gives its share, the driver keeps the first N): the prompt, the
    completion as the reward function saw it, the label, every reward component, the scalar the
    method's ``normalize_rewards`` made of them (None when the group was dropped) and the policy
    version (the training step whose weights generated it)."""
    workers = getattr(config, "rollout_num_workers", 1)
    limit = min(-(-config.log_completions // workers), len(completions))
    if limit <= 0:
        return []
    matrix = rewards.reshape(rewards.shape[0], -1)
    position = keep.long().cumsum(0) - 1  # sample -> its row among the kept samples
    keys = tuple(config.algorithm.reward_keys)
    return [
        {
            "policy_version": int(version),
            "prompt": prompts[i],
            "completion": completions[i],
            "label": _jsonable(labels[i]),
            "rewards": {key: float(matrix[i, j]) for j, key in enumerate(keys)},
            "normalized_reward": float(normalized[position[i]]) if bool(keep[i]) else None,
        }
        for i in range(limit)
    ]


def response_stats(response_ids: torch.Tensor, response_mask: torch.Tensor, max_new_tokens: int, eos_id: int) -> dict:
    """One rollout worker's response-length statistics for ``response_metrics``: the longest
    response, and how many responses reached ``max_new_tokens`` without ending in ``eos_id``
    (truncated at the length limit)."""
    lengths = response_mask.sum(1)
    if lengths.numel() == 0:
        return {"response_len_max": 0, "truncated": 0}
    full = lengths >= max_new_tokens
    truncated = full & (response_ids[:, -1] != eos_id) if response_ids.shape[1] else full
    return {"response_len_max": int(lengths.max()), "truncated": int(truncated.sum())}


def response_metrics(rolls: Sequence[Mapping]) -> dict[str, float]:
    """The step's always-on generation health metrics over the reports of its rollout workers:
    ``rollout/response_len_max``, ``rollout/truncated_frac`` (share of responses cut at
    ``--rollout-max-response-len``) and ``rollout/tokens_per_s`` (generated tokens over the slowest
    worker's generation time). A report without the statistics of ``response_stats`` adds nothing.
    The workers' ``completion_records`` (``--log-completions``) travel along under ``COMPLETIONS_KEY``."""
    out: dict[str, float] = {}
    samples = sum(r["samples"] for r in rolls)
    if rolls and all("response_len_max" in r for r in rolls):
        out["rollout/response_len_max"] = max(r["response_len_max"] for r in rolls)
        out["rollout/truncated_frac"] = sum(r["truncated"] for r in rolls) / max(samples, 1)
    generate_s = max((r.get("times", {}).get("time/rollout/generate_s", 0.0) for r in rolls), default=0.0)
    if generate_s > 0:
        out["rollout/tokens_per_s"] = sum(r["generated_tokens"] for r in rolls) / generate_s
    samples = [record for r in rolls for record in r.get("completions", ())]  # in worker order
    if samples:
        out[COMPLETIONS_KEY] = samples
    return out


def gpu_peak_mib(name: str) -> dict[str, float]:
    """``{name: MiB}``: the most GPU memory this process's tensors have held (``torch.cuda.max_memory_allocated``),
    or nothing where the process has not touched a GPU."""
    import torch

    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return {}
    return {name: round(torch.cuda.max_memory_allocated() / 2**20, 1)}


def service_metrics(reports: list[dict]) -> dict[str, float]:
    """``<service>/batch_size_mean`` (samples per batched call, over the step's calls of every rollout
    worker; a batch mixing two workers' samples counts once), ``<service>/calls``,
    ``<service>/replicas_used`` and ``<service>/time_s`` (the longest any worker waited for it) from
    the workers' ``CombinedRewards.take_stats()``."""
    metrics: dict[str, float] = {}
    for metric in sorted({m for r in reports for m in r}):
        batches: dict[str, int] = {}
        for r in reports:
            batches.update(r.get(metric, {}).get("batches", {}))
        if batches:
            metrics[f"{metric}/batch_size_mean"] = sum(batches.values()) / len(batches)
            metrics[f"{metric}/calls"] = float(len(batches))
            # batch ids are "<replica>-<call>": how many replicas shared the step's samples
            metrics[f"{metric}/replicas_used"] = float(len({b.rsplit("-", 1)[0] for b in batches}))
        metrics[f"{metric}/time_s"] = max(r[metric]["time_s"] for r in reports if metric in r)
    return metrics
