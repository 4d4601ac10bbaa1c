"""The rollout side of the reward services: a reward function plus named components scored by
services (the reward model, the judge), behind the one reward-matrix call ``sample_groups`` makes.

``CombinedRewards`` sends every sample of a round to each service at once (one request per sample,
all in flight together), so the Serve replicas can batch them (``@serve.batch``), and calls the reward
function (``--custom-rm-path`` or the task's) for the other components while the services work. The
columns come back in ``--reward-keys`` order. Each service's calls are counted per batch for the
``<service>/batch_size_mean`` and ``<service>/time_s`` metrics (``take_stats``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import torch

from relax.rollout.rewards import RewardError, function_name, reward_matrix, score

# How long one sample may wait for a service before the run fails, naming the service and sample.
SERVICE_TIMEOUT_S = 600.0


@attrs.define
class Service:
    """One scoring service as the rollout sees it: its reward component, its name in messages and
    metrics, and its Serve handle (set once the deployment is up; see ``RolloutCore``)."""

    key: str  # the reward component it fills (--reward-model-key / --judge-key)
    metric: str  # metric prefix and name in messages: "reward_model" or "judge"
    flag: str  # the flag that configures it, for messages
    key_flag: str  # the flag that names its component
    handle: Any = None

    @property
    def title(self) -> str:
        return f"the {self.metric.replace('_', ' ')} service ({self.flag})"


def services_of(config) -> list[Service]:
    """The services the run configures (``--reward-model-path``, ``--judge-model-path``), in that order."""
    out = []
    if config.reward_model_path:
        out.append(Service(config.reward_model_key, "reward_model", f"--reward-model-path {config.reward_model_path}",
                           "--reward-model-key"))
    if config.judge_model_path:
        out.append(Service(config.judge_key, "judge", f"--judge-model-path {config.judge_model_path}", "--judge-key"))
    return out


def _label(value) -> Any:
    """Labels travel to the service as plain text (numbers and None included)."""
    return value if value is None or isinstance(value, str) else str(value)


class CombinedRewards:
    """``--reward-keys`` filled by a reward function (``fn``, its components ``fn_keys``) and by
    services; ``matrix`` returns the float64 ``[N, K]`` reward matrix in ``keys`` order."""

    def __init__(self, fn, fn_keys: Sequence[str], services: Sequence[Service], keys: Sequence[str]):
        self.fn, self.fn_keys, self.services, self.keys = fn, tuple(fn_keys), list(services), tuple(keys)
        self.where = "a pre-flight call"  # "step 3", "the evaluation of policy version 2"
        self._batches: dict[str, dict[str, int]] = {s.metric: {} for s in self.services}
        self._wait: dict[str, float] = {s.metric: 0.0 for s in self.services}

    def connect(self, handles: Mapping[str, Any]) -> None:
        """Attach the Serve handles (``metric -> DeploymentHandle``)."""
        for service in self.services:
            service.handle = handles[service.metric]

    def take_stats(self) -> dict[str, dict]:
        """``{metric: {"batches": {batch id: samples in it}, "time_s": s}}`` since the last call; resets."""
        stats = {m: {"batches": dict(self._batches[m]), "time_s": self._wait[m]} for m in self._batches}
        for m in self._batches:
            self._batches[m].clear()
            self._wait[m] = 0.0
        return stats

    def _send(self, service: Service, prompts, completions, labels) -> list:
        if service.handle is None:
            raise RewardError(f"{self.where}: {service.title} is not connected (its Serve deployment never came up)")
        return [service.handle.remote((p, c, _label(lab))) for p, c, lab in zip(prompts, completions, labels)]

    def _collect(self, service: Service, responses: list, t0: float, prompts, completions) -> list[float]:
        scores = []
        for i, response in enumerate(responses):
            try:
                out = response.result(timeout_s=SERVICE_TIMEOUT_S)
            except Exception as exc:
                raise RewardError(
                    f"{self.where}: sample {i}: {service.title} failed on prompt {_short(prompts[i])}, completion "
                    f"{_short(completions[i])}: {type(exc).__name__}: {_first_line(exc)}"
                ) from exc
            value = float(out["score"])
            if not math.isfinite(value):
                raise RewardError(f"{self.where}: sample {i}: {service.title} returned {value} (not finite)")
            self._batches[service.metric][out["batch"]] = int(out["size"])
            scores.append(value)
        self._wait[service.metric] += time.perf_counter() - t0
        return scores

    def matrix(self, prompts, completions, labels, metadata, concurrency: int = 1) -> torch.Tensor:
        n = len(prompts)
        t0 = time.perf_counter()
        pending = [(s, self._send(s, prompts, completions, labels)) for s in self.services]
        columns: dict[str, torch.Tensor] = {}
        if self.fn_keys:  # the function's components, computed while the services work
            own = score(self.fn, prompts, completions, labels, metadata, self.fn_keys, concurrency)
            columns.update({k: own[:, j] for j, k in enumerate(self.fn_keys)})
        for service, responses in pending:
            columns[service.key] = torch.tensor(self._collect(service, responses, t0, prompts, completions),
                                                dtype=torch.float64)
        return torch.stack([columns[k] for k in self.keys], 1) if n else torch.zeros(0, len(self.keys),
                                                                                      dtype=torch.float64)


def check_function_values(values: Sequence, fn, fn_keys: Sequence[str], services: Sequence[Service]) -> None:
    """The reward function's values (pre-flight): its components, and none that a service fills."""
    taken = {s.key: s for s in services}
    for i, value in enumerate(values):
        if isinstance(value, Mapping):
            clash = sorted(set(value) & set(taken))
            if clash:
                s = taken[clash[0]]
                raise RewardError(
                    f"sample {i}: reward function {function_name(fn)} returns the component {clash[0]!r}, which "
                    f"{s.title} fills; rename one of them (e.g. {s.key_flag} {clash[0]}_model, and the same in "
                    "--reward-keys)"
                )
    if fn_keys:
        reward_matrix(values, fn_keys, function_name(fn))


def _short(text, limit: int = 60) -> str:
    text = repr(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[-1].strip() if lines else type(exc).__name__
