"""Spawned-rank body of the teacher test: one actor step of on-policy distillation per backend (module
level, so that spawn can pickle it by name)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch


def distill_step_per_backend(rank: int, world: int, teacher: str) -> dict:
    """``{backend: metrics}`` of one ``ActorCore`` step of on-policy-distill (teacher pass, advantages
    on the rank, two optimizer steps) on the same samples, with the torch and the Megatron backend."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "device"))
    from device_steps import write_step

    from relax.algorithms.distill import OnPolicyDistill
    from relax.config.run import RunConfig
    from relax.runtime.data.memory_plane import MemoryDataPlane
    from relax.runtime.step.actor_worker import ActorCore

    algorithm = OnPolicyDistill.Config(reward_keys=("a", "b"), n_samples_per_prompt=4)
    result = {}
    for backend in ("torch", "megatron"):
        config = RunConfig(algorithm=algorithm, advantage_estimator="on-policy-distill", teacher_checkpoint=teacher,
                           backend=backend, rollout_batch_size=4, num_steps_per_rollout=2, seed=5, lr=1e-3)
        plane = MemoryDataPlane()
        plan = write_step(plane, 1)
        actor = ActorCore(config, "on-policy-distill", advantages_on_actor=True, with_reference=False,
                          with_teacher=True, data_plane=plane)
        metrics, _ = actor.train(1, plan)
        result[backend] = {k: v for k, v in metrics.items() if k.startswith(("actor/", "distill/"))}
    return result


def sharper_teacher(path: str) -> str:
    """The addition task's warm-up with a sharper output layer: a teacher that is not the student."""
    from relax.models.tiny.weights import CHECKPOINT

    state = torch.load(CHECKPOINT, weights_only=True)
    state["model"] = {k: v * 2.0 if k == "ln_f.weight" else v for k, v in state["model"].items()}
    torch.save(state, path)
    return path
