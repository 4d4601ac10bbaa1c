"""Where a relax checkpoint is on disk: the path rules ``--load``, ``--teacher-checkpoint`` and a
``relax sft`` checkpoint share, and where the policy's weights sit in one.

A run writes ``<output_dir>/checkpoints/step_<k>/state.pt``. A path names a checkpoint when it is a
checkpoint file, a ``step_*`` directory holding ``state.pt``, or a run directory (its highest step).
A run directory's checkpoints in step order are in the order they were written: a run resumed in it
from an earlier step first sets the later ones aside (``relax.runtime.files.checkpoint_files``).
"""

from __future__ import annotations

from pathlib import Path

STATE_FILE = "state.pt"
CHECKPOINTS_DIR = "checkpoints"


def checkpoint_state(path: str | Path) -> Path | None:
    """The checkpoint file ``path`` names, or None when it names none."""
    p = Path(path)
    if p.is_file():
        return p
    if (p / STATE_FILE).is_file():
        return p / STATE_FILE
    steps = saved_steps(p)
    return steps[-1] / STATE_FILE if steps else None


def step_of(directory: Path) -> int | None:
    """The step of a ``step_<k>`` directory, or None for any other name."""
    digits = directory.name.removeprefix("step_")
    return int(digits) if directory.name.startswith("step_") and digits.isdigit() else None


def saved_steps(run_dir: str | Path) -> list[Path]:
    """The ``checkpoints/step_<k>`` directories of ``run_dir`` that hold a checkpoint, lowest step first."""
    found = [d for d in (Path(run_dir) / CHECKPOINTS_DIR).glob("step_*")
             if step_of(d) is not None and (d / STATE_FILE).is_file()]
    return sorted(found, key=step_of)


def policy_weights(state: dict) -> dict:
    """The policy's weights in a loaded run checkpoint of the torch backend (``KeyError`` or
    ``TypeError`` when it holds none)."""
    return state["actor"]["backend"]["model"]
