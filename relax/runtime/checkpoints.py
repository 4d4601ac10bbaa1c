"""Run checkpoints: ``<output_dir>/checkpoints/step_<k>/state.pt`` (+ ``hf/`` with ``--hf-checkpoint``).

A checkpoint holds the step, the actor's backend state and RNG, the rollout's prompt position and
generator, the critic's state, and which ``--advantage-estimator`` and ``--backend`` wrote it, so
that ``--load`` can refuse a run it cannot continue before any worker starts.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from relax.backends.registry import checkpoint_backend


def checkpoint_path(out: Path, step: int) -> Path:
    return out / "checkpoints" / f"step_{step:06d}" / "state.pt"


def resolve_checkpoint(path: str) -> Path:
    """``--load``: a ``state.pt``, a ``step_*`` directory, or a run directory (its latest checkpoint)."""
    p = Path(path)
    if p.is_file():
        return p
    if (p / "state.pt").is_file():
        return p / "state.pt"
    steps = sorted((p / "checkpoints").glob("step_*/state.pt"))
    if steps:
        return steps[-1]
    raise FileNotFoundError(
        f"--load {path}: no checkpoint found (expected a state.pt, a checkpoints/step_* directory, or a run "
        "directory containing checkpoints/); save one with --save-interval"
    )


def check_checkpoint(config, state: dict, source, *, has_critic: bool) -> None:
    """Refuse a checkpoint this run cannot continue, before any worker starts."""
    if (state["critic"] is None) == has_critic:
        raise ValueError(f"--load {source}: the checkpoint and this run disagree on whether a critic exists")
    if state["advantage_estimator"] != config.advantage_estimator:
        raise ValueError(
            f"--load {source}: the checkpoint was trained with --advantage-estimator "
            f"{state['advantage_estimator']!r}, this run uses {config.advantage_estimator!r}"
        )
    saved = checkpoint_backend(state)
    if saved != config.backend:
        raise ValueError(
            f"--load {source}: the checkpoint was written by --backend {saved}, this run uses --backend "
            f"{config.backend}; the two store weights and optimizer state differently. Resume with "
            f"--backend {saved}, or start a new run without --load"
        )


def save_checkpoint(runtime, out: Path, step: int) -> Path:
    """Write the live roles' state for ``step``; returns the ``state.pt`` path."""
    from relax.runtime.cluster import get

    # A backend that gathers its state over all ranks (a collective) is asked on every rank.
    actors = runtime.actors if runtime.backend_cls.gathers_on_all_ranks else runtime.actors[:1]
    refs = [a.state_dict.remote() for a in actors] + [runtime.rollout.state_dict.remote()]
    if runtime.critic is not None:
        refs.append(runtime.critic.state_dict.remote())
    parts = get(refs, "checkpoint")
    actor, rollout = parts[0], parts[len(actors)]
    critic = parts[len(actors) + 1] if runtime.critic is not None else None
    state = {"step": step, "actor": actor, "rollout": rollout, "critic": critic,
             "advantage_estimator": runtime.config.advantage_estimator, "backend": runtime.config.backend}
    path = checkpoint_path(out, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)  # a crash mid-write never leaves a truncated checkpoint behind
    if runtime.config.hf_checkpoint:
        from relax.models.hf.checkpoint import export_hf_checkpoint

        export_hf_checkpoint(actor["backend"]["model"], runtime.config.hf_checkpoint, path.parent / "hf")
    return path


def restore_checkpoint(runtime, state: dict) -> None:
    """Load ``state`` into the live roles (the rollout also takes the actor's weights)."""
    from relax.runtime.cluster import get

    refs = [a.load_state_dict.remote(state["actor"]) for a in runtime.actors]
    refs.append(runtime.rollout.load_state_dict.remote(state["rollout"], state["actor"]["backend"]["model"]))
    if runtime.critic is not None:
        refs.append(runtime.critic.load_state_dict.remote(state["critic"]))
    get(refs, "checkpoint restore")
