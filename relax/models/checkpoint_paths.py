"""Where a relax checkpoint is on disk: the path rules ``--load``, ``--teacher-checkpoint`` and a
``relax sft`` checkpoint share, and where the policy's weights sit in one.

A run writes ``<output_dir>/checkpoints/step_<k>/state.pt``. A path names a checkpoint when it is a
checkpoint file, a ``step_*`` directory holding ``state.pt``, or a run directory (its newest
``step_*``; the step number is zero-padded, so the newest sorts last).
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
    steps = sorted((p / CHECKPOINTS_DIR).glob(f"step_*/{STATE_FILE}"))
    return steps[-1] if steps else None


def policy_weights(state: dict) -> dict:
    """The policy's weights in a loaded run checkpoint of the torch backend (``KeyError`` or
    ``TypeError`` when it holds none)."""
    return state["actor"]["backend"]["model"]
