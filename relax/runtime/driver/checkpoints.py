"""Saving and restoring a run's checkpoint with the live roles: every worker's state gathered under its
worker's name and written, and a checkpoint's state loaded back into the workers (the rollout engines
through the weight route). The file format: ``relax.runtime.files.checkpoint_files``."""

from __future__ import annotations

from pathlib import Path

from relax.runtime.files.checkpoint_files import (
    algorithm_settings,
    checkpoint_path,
    one_line_on_failure,
    prune_checkpoints,
    rollout_states,
    write_state,
)


def save_checkpoint(runtime, out: Path, step: int, timeout: float | None = None) -> Path:
    """Write the live roles' state for ``step``; returns the ``state.pt`` path. With
    ``--keep-checkpoints N`` the oldest checkpoints beyond N are deleted once this one is written.
    ``timeout`` bounds the wait for the workers' states (``WorkerDied`` when it runs out)."""
    # Every rank is asked: one whose backend gathers its state over all ranks (a collective: Megatron,
    # --sharding fsdp) joins in, the others answer None at once (rank 0 holds the state).
    actors = runtime.actors
    refs = [a.state_dict.remote() for a in actors] + [w.state_dict.remote() for w in runtime.rollouts]
    if runtime.critic is not None:
        refs.append(runtime.critic.state_dict.remote())
    parts = get_by_role(refs, role_names(len(actors), len(runtime.rollouts), runtime.critic is not None), timeout)
    actor = parts[0]
    rollout = parts[len(actors) : len(actors) + len(runtime.rollouts)]  # one state per rollout worker
    critic = parts[-1] if runtime.critic is not None else None
    state = {"step": step, "actor": actor, "rollout": rollout, "critic": critic,
             "advantage_estimator": runtime.config.advantage_estimator, "backend": runtime.config.backend,
             "algorithm": algorithm_settings(runtime.config)}  # compared on resume (check_checkpoint)
    path = checkpoint_path(out, step)
    with one_line_on_failure(out, step, path.parent):  # a full disk: no partial files, no pruning after it
        path.parent.mkdir(parents=True, exist_ok=True)
        write_state(state, path)
    if runtime.config.hf_checkpoint:
        from relax.models.hf.checkpoint import export_hf_checkpoint

        with one_line_on_failure(out, step, path.parent / "hf"):  # state.pt stays: it is whole
            export_hf_checkpoint(runtime.backend_cls.weights_in_state(actor["backend"]),
                                 runtime.config.hf_checkpoint, path.parent / "hf")
    keep = getattr(runtime.config, "keep_checkpoints", None)
    if keep:
        prune_checkpoints(out, keep)
    return path


def role_names(actors: int, rollouts: int, critic: bool) -> list[str]:
    """How a wait names each worker of a checkpoint (``the actor (rank 1) worker died``)."""
    names = ["actor"] if actors == 1 else [f"actor (rank {i})" for i in range(actors)]
    names += ["rollout"] if rollouts == 1 else [f"rollout (worker {i})" for i in range(rollouts)]
    return names + (["critic"] if critic else [])


def get_by_role(refs: list, names: list[str], timeout: float | None = None) -> list:
    """The results of ``refs``, each waited for under its worker's name, so that a dead worker is named
    (all were submitted at once: waiting one after the other takes as long as waiting for all)."""
    import time

    from relax.runtime.session.waits import get

    deadline = None if timeout is None else time.monotonic() + timeout
    results = []
    for ref, name in zip(refs, names):
        left = None if deadline is None else max(0.1, deadline - time.monotonic())
        results.extend(get([ref], name, timeout=left))
    return results


def restore_checkpoint(runtime, state: dict) -> None:
    """Load ``state`` into the live roles (the rollout also takes the actor's weights)."""
    refs = [a.load_state_dict.remote(state["actor"]) for a in runtime.actors]
    # The rollout engines take the restored weights through the weight route, as after a training
    # step: actor rank 0 publishes them (every rank joins a gathering export) and every rollout worker
    # receives the handle, with the run's transport (--weight-transport).
    published = [a.publish_weights.remote(state["step"]) for a in runtime.actors]
    weights = published[0]  # rank 0's handle
    refs += [w.load_state_dict.remote(r, weights) for w, r in zip(runtime.rollouts, rollout_states(state))]
    if runtime.critic is not None:
        refs.append(runtime.critic.load_state_dict.remote(state["critic"]))
    get_by_role(refs, role_names(len(runtime.actors), len(runtime.rollouts), runtime.critic is not None))
