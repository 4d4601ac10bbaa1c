"""Run checkpoints: ``<output_dir>/checkpoints/step_<k>/state.pt`` (+ ``hf/`` with ``--hf-checkpoint``).

A checkpoint holds the step, the actor's backend state and RNG, the rollout's prompt position and
generator, the critic's state, and which ``--advantage-estimator`` and ``--backend`` wrote it, so
that ``--load`` can refuse a run it cannot continue before any worker starts.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from pathlib import Path

import torch

from relax.backends.registry import checkpoint_backend
from relax.models.checkpoint_paths import CHECKPOINTS_DIR, STATE_FILE, checkpoint_state, saved_steps, step_of
from relax.runtime.files.run_errors import RunFailed


def checkpoint_path(out: Path, step: int) -> Path:
    return out / CHECKPOINTS_DIR / f"step_{step:06d}" / STATE_FILE


def resolve_checkpoint(path: str) -> Path:
    """``--load``: a ``state.pt``, a ``step_*`` directory, or a run directory (its latest checkpoint)."""
    found = checkpoint_state(path)
    if found is not None:
        return found
    raise FileNotFoundError(
        f"--load {path}: no checkpoint found (expected a state.pt, a checkpoints/step_* directory, or a run "
        "directory containing checkpoints/); save one with --save-interval"
    )


class CheckpointError(ValueError):
    """``--load`` names a checkpoint that cannot be read or that this run cannot continue."""


# What ``save_checkpoint`` writes; a state without one of them was not written by relax (or is damaged).
# (``backend`` is not required: older checkpoints are recognized by their layout.)
CHECKPOINT_KEYS = ("step", "actor", "rollout", "critic", "advantage_estimator")


def read_checkpoint(path: str) -> tuple[Path, dict]:
    """``--load path`` -> ``(state.pt path, state)``; an unreadable, truncated or incomplete file raises
    ``CheckpointError`` naming it (never a raw unpickling error)."""
    try:
        ckpt = resolve_checkpoint(path)
    except FileNotFoundError as exc:
        raise CheckpointError(str(exc)) from None
    where = f"--load {path}" + (f" ({ckpt})" if str(ckpt) != str(path) else "")
    if ckpt.stat().st_size == 0:
        raise CheckpointError(f"{where}: the checkpoint file is empty; load another checkpoint of the run")
    try:
        state = torch.load(ckpt, map_location="cpu", weights_only=False)
    except Exception as exc:  # noqa: BLE001 - truncated zip, garbage bytes, EOF: all mean "not readable"
        reason = str(exc).splitlines()[0] if str(exc) else "no details"
        raise CheckpointError(
            f"{where}: not a readable relax checkpoint (truncated or corrupt: {type(exc).__name__}: {reason}); "
            "load another checkpoint of the run"
        ) from None
    if not isinstance(state, dict):
        raise CheckpointError(
            f"{where}: holds a {type(state).__name__}, not a relax checkpoint (relax writes "
            "<output_dir>/checkpoints/step_*/state.pt)"
        )
    missing = [k for k in CHECKPOINT_KEYS if k not in state]
    if missing:
        raise CheckpointError(
            f"{where}: incomplete checkpoint, missing {', '.join(missing)} (relax writes "
            "<output_dir>/checkpoints/step_*/state.pt with --save-interval); load another checkpoint"
        )
    step = state["step"]
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise CheckpointError(f"{where}: its step {step!r} is not a non-negative integer; the file is damaged")
    return ckpt, state


def rollout_states(state: dict) -> list[dict]:
    """The rollout workers' states, in worker order (checkpoints of one worker stored a single dict)."""
    rollout = state["rollout"]
    return list(rollout) if isinstance(rollout, (list, tuple)) else [rollout]


# AlgorithmConfig fields that define the objective: a resumed run with other values would optimize
# another reward, so --load refuses it. Every other hyper-parameter may change on resume (e.g. a lower
# --kl-coef or clip range for the rest of a run): check_checkpoint returns a warning with the diff.
RESUME_MUST_MATCH = ("reward_keys", "reward_weights")


def algorithm_settings(config) -> dict:
    """The run's algorithm hyper-parameters (``AlgorithmConfig`` fields), as stored in a checkpoint."""
    import attrs

    return {f.name: getattr(config.algorithm, f.name) for f in attrs.fields(type(config.algorithm))}


def check_checkpoint(config, state: dict, source, *, has_critic: bool) -> list[str]:
    """Refuse a checkpoint this run cannot continue, before any worker starts; return warnings (the
    hyper-parameters that differ from the checkpoint's, where continuing is meaningful)."""
    saved_algorithm = state.get("algorithm")  # absent in checkpoints written before it was stored
    changed = {} if not isinstance(saved_algorithm, dict) else {
        name: (saved_algorithm[name], value) for name, value in algorithm_settings(config).items()
        if name in saved_algorithm and saved_algorithm[name] != value
    }
    must = {name: diff for name, diff in changed.items() if name in RESUME_MUST_MATCH}
    if must:
        diff = "; ".join(f"{name}: checkpoint {old!r}, this run {new!r}" for name, (old, new) in must.items())
        raise CheckpointError(
            f"--load {source}: the checkpoint was trained on another reward ({diff}); resume with the "
            "checkpoint's --reward-keys / --reward-weights, or start a new run without --load"
        )
    if state["advantage_estimator"] != config.advantage_estimator:
        raise CheckpointError(
            f"--load {source}: the checkpoint was trained with --advantage-estimator "
            f"{state['advantage_estimator']!r}, this run uses {config.advantage_estimator!r}; resume with "
            f"--advantage-estimator {state['advantage_estimator']}, or start a new run without --load"
        )
    if (state["critic"] is None) == has_critic:
        raise CheckpointError(
            f"--load {source}: the checkpoint and this run disagree on whether a critic exists (the checkpoint "
            f"{'has one' if state['critic'] is not None else 'has none'}, this run "
            f"{'needs one' if has_critic else 'has none'}): the method's needs_critic changed since it was "
            "written, or the file is damaged; start a new run without --load"
        )
    if state["step"] >= config.num_rollout:
        raise CheckpointError(
            f"--load {source}: the checkpoint is at step {state['step']} and --num-rollout is "
            f"{config.num_rollout}, so there is nothing left to train; pass --num-rollout above "
            f"{state['step']} to train further"
        )
    prompts = state.get("rollout")
    prompts = (prompts[0] if isinstance(prompts, (list, tuple)) and prompts else prompts) or {}
    saved_seed = prompts.get("prompts", {}).get("seed") if isinstance(prompts.get("prompts"), dict) else None
    if saved_seed is not None and saved_seed != config.seed:
        raise CheckpointError(
            f"--load {source}: the checkpoint was trained with --seed {saved_seed}, this run has --seed "
            f"{config.seed}; a resumed run continues the checkpoint's prompt order and sampling, so resume "
            f"with --seed {saved_seed}"
        )
    saved = checkpoint_backend(state)
    if saved != config.backend:
        raise CheckpointError(
            f"--load {source}: the checkpoint was written by --backend {saved}, this run uses --backend "
            f"{config.backend}; the two store weights and optimizer state differently. Resume with "
            f"--backend {saved}, or start a new run without --load"
        )
    workers = len(rollout_states(state))
    if workers != config.rollout_num_workers:
        raise CheckpointError(
            f"--load {source}: the checkpoint was written by {workers} rollout worker(s), this run has "
            f"--rollout-num-workers {config.rollout_num_workers}; each worker's prompt stream and sampler "
            f"resume from its own state, so resume with --rollout-num-workers {workers}"
        )
    return [
        f"--load {source}: {name} differs from the checkpoint's ({old!r} -> {new!r}); the rest of the run "
        "uses the new value"
        for name, (old, new) in changed.items()
    ]


def write_state(state: dict, path: Path) -> None:
    """``torch.save`` to ``path`` through a temporary file renamed into place: a crash mid-write never
    leaves a truncated checkpoint, and a failed write leaves no temporary file. (Through a Python
    file object, so that a full disk's ``OSError`` is kept as the cause of torch's RuntimeError.)"""
    tmp = path.with_suffix(".tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save(state, f)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


class CheckpointSaveError(RunFailed):
    """A checkpoint could not be written (full disk, I/O error); names the step, the path and the last
    good checkpoint."""


@contextlib.contextmanager
def one_line_on_failure(out: Path, step: int, where: Path):
    """A failure inside becomes ``CheckpointSaveError``; ``where`` is removed if this block created it."""
    created = not where.exists()
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - a full disk surfaces as OSError or torch's RuntimeError
        if created:
            shutil.rmtree(where, ignore_errors=True)
        raise save_failed(out, step, where, exc) from exc


def _os_error(exc: BaseException | None) -> OSError | None:
    """The ``OSError`` in ``exc``'s chain (torch reports a failed write as a RuntimeError)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, OSError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def last_good_checkpoint(out: Path, but: Path | None = None) -> Path | None:
    """The complete ``checkpoints/step_*`` directory of ``out`` with the highest step (other than ``but``)."""
    steps = [p for p in saved_steps(out) if p != but]
    return steps[-1] if steps else None


def save_failed(out: Path, step: int, where: Path, exc: BaseException) -> CheckpointSaveError:
    """The one-line error of a checkpoint of ``step`` that could not be written to ``where``."""
    os_error = _os_error(exc)
    if os_error is not None:
        reason = os_error.strerror or str(os_error)
        if os_error.errno in (errno.ENOSPC, errno.EDQUOT):
            with contextlib.suppress(OSError):
                reason += f" ({shutil.disk_usage(Path(out)).free / 2**20:.1f} MiB free)"
            reason += "; free space or pass another --output-dir"
    else:
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'no details'}"
    good = last_good_checkpoint(out, but=where)
    last = (f"the last good checkpoint is {good} (resume with --load {good})" if good is not None
            else "no earlier checkpoint was written")
    return CheckpointSaveError(f"saving the checkpoint of step {step} to {where} failed: {reason}; its partial "
                               f"files were removed and {last}")


def prune_checkpoints(out: Path, keep: int) -> list[Path]:
    """``--keep-checkpoints N``: delete all but the ``keep`` highest-step ``checkpoints/step_*``
    directories of ``out`` (called after a successful save, so the one just written is always kept:
    a resumed run set the higher ones aside, ``set_aside_later_checkpoints``); returns the deleted
    directories."""
    steps = saved_steps(out)
    doomed = steps[: max(0, len(steps) - keep)]
    for directory in doomed:
        shutil.rmtree(directory, ignore_errors=True)
    return doomed


SUPERSEDED_PREFIX = "superseded_after_step_"


def set_aside_later_checkpoints(out: Path, step: int) -> tuple[Path, list[int]] | None:
    """A run resumed from step ``step`` into ``out`` trains the later steps again, so the checkpoints
    ``out`` holds after ``step`` belong to the continuation it replaces. They move, whole, to
    ``checkpoints/superseded_after_step_<step>/`` (nothing is deleted), so that the directory's
    checkpoints in step order are again the order they were written: ``--load DIR`` takes the highest
    step, and ``--keep-checkpoints`` deletes the lowest. Returns ``(where, their steps)``, or None when
    there were none."""
    later = [d for d in saved_steps(out) if step_of(d) > step]
    if not later:
        return None
    where = base = Path(out) / CHECKPOINTS_DIR / f"{SUPERSEDED_PREFIX}{step:06d}"
    copies = 1
    while where.exists():  # resumed from the same step before
        copies += 1
        where = base.with_name(f"{base.name}_{copies}")
    where.mkdir()
    for directory in later:
        directory.rename(where / directory.name)
    return where, [step_of(d) for d in later]


def superseded_warnings(load, out: Path, step: int) -> list[str]:
    """``set_aside_later_checkpoints`` for a run that ``--load load`` resumes from ``step`` into ``out``,
    and the warning that says where the later checkpoints went."""
    moved = set_aside_later_checkpoints(out, step)
    if moved is None:
        return []
    where, steps = moved
    return [f"--load {load} resumes from step {step}; the checkpoints of step{'s' if len(steps) > 1 else ''} "
            f"{', '.join(map(str, steps))} in {out} came after it and are trained again, so they were moved "
            f"to {where}"]
