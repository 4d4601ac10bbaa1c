"""The configuration rule of ``--in-process`` (``relax.runtime.cluster.local_runtime``): the run's one rollout
worker and one actor rank run in the driver's process, in the synchronous schedule, on the CPU or on
the machine's first GPU (both models on it, as a Ray run places one actor rank and one rollout worker on
one GPU). What needs Ray (several workers, a cluster to join, Megatron, vLLM, the asynchronous
schedule, a critic worker, the Serve reward services) is refused before anything starts, naming the flag; never a silent
fall back to the Ray runtime.

The rule is ``rule(config, algorithm, who, errors, warnings)``, run by ``relax.runtime.checks.validation``.
"""

from __future__ import annotations

import attrs

from relax.config.run import RunConfig
from relax.rollout.engines import in_process_refusal

FIX = "drop --in-process to run it on Ray"


def _needs_ray(config, algorithm) -> list[str]:
    reasons = []
    if config.rollout_num_workers > 1:
        reasons.append(f"--rollout-num-workers {config.rollout_num_workers} (in-process runs one rollout worker)")
    if config.actor_num_workers > 1:
        reasons.append(f"--actor-num-workers {config.actor_num_workers} (in-process runs one actor rank)")
    if config.ray_address:
        reasons.append(f"--ray-address {config.ray_address} (in-process starts no Ray and joins no cluster)")
    default_backend = attrs.fields(RunConfig).backend.default
    if config.backend != default_backend:  # e.g. Megatron: torch.distributed and its parallel state per process
        reasons.append(f"--backend {config.backend} (in-process runs the {default_backend} backend; the others set "
                       "up process-wide state that belongs in a worker process)")
    engine = in_process_refusal(config)  # e.g. vLLM (relax.rollout.registry: the engine's runs_in_process)
    if engine:
        reasons.append(engine)
    if config.weight_transport == "collective":
        reasons.append("--weight-transport collective (a broadcast between worker processes; in-process hands "
                       "the weights over in memory)")
    if config.fully_async:
        reasons.append("--fully-async (in-process runs the synchronous schedule: one call after the other)")
    if algorithm.needs_critic:
        reasons.append(f"--advantage-estimator {config.advantage_estimator} (it needs a critic worker)")
    for flag, value in (("--reward-model-path", config.reward_model_path),
                        ("--judge-model-path", config.judge_model_path)):
        if value:
            reasons.append(f"{flag} {value} (the reward services run on Ray Serve)")
    return reasons


def check_in_process(config, algorithm, who, errors, warnings):
    if not config.in_process:
        return
    for reason in _needs_ray(config, algorithm):
        errors.append(f"--in-process cannot run {reason}; {FIX}")
