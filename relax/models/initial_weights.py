"""Checkpoints of ``relax sft`` as the starting point of another run.

``relax sft`` writes each checkpoint as ``<output_dir>/checkpoints/step_<k>/`` holding ``state.pt`` (a
relax checkpoint: the backend's state under ``actor``/``backend``), the marker ``sft.json`` and the
trained model in the form the next command loads: ``model.pt`` for the built-in model (what
``relax.models.tiny.weights.load_warmup_model`` reads) or ``hf/`` for a Hugging Face model (what
``--hf-checkpoint`` takes). ``relax train --load`` of such a checkpoint starts a new run from its
weights (policy, reference and the rollout engines alike) instead of resuming one.

Path rules are those of ``--load``: a ``state.pt``, a ``step_*`` directory, or a run directory (its
latest checkpoint).
"""

from __future__ import annotations

import json
from pathlib import Path

from relax.models.checkpoint_paths import checkpoint_state

SFT_MARKER = "sft.json"
TINY_MODEL_FILE = "model.pt"
HF_MODEL_DIR = "hf"


def checkpoint_dir(path: str | Path) -> Path | None:
    """The ``step_*`` directory ``--load path`` names (None when it names none)."""
    state = checkpoint_state(path)
    return state.parent if state is not None else None


def sft_checkpoint(path: str | Path | None) -> dict | None:
    """The marker of a ``relax sft`` checkpoint at ``path`` (with ``dir``: its directory), else None."""
    if not path:
        return None
    directory = checkpoint_dir(path)
    if directory is None or not (directory / SFT_MARKER).is_file():
        return None
    try:
        marker = json.loads((directory / SFT_MARKER).read_text())
    except (OSError, ValueError):
        return None
    return {**marker, "dir": directory} if isinstance(marker, dict) else None


def sft_tiny_model(path: str | Path | None) -> Path | None:
    """The built-in model's file of a ``relax sft`` checkpoint at ``path`` (None: not one, or not of
    the built-in model)."""
    marker = sft_checkpoint(path)
    if marker is None or marker.get("model") != "tiny":
        return None
    return marker["dir"] / TINY_MODEL_FILE


def write_marker(directory: Path, *, model: str, step: int, hf_checkpoint: str | None, task: str,
                 extra: dict | None = None) -> Path:
    """``sft.json``: which model the checkpoint holds (``tiny`` or ``hf``) and where it came from;
    ``extra``: more keys (``relax sft`` records its data order for ``relax sft --load``)."""
    path = directory / SFT_MARKER
    marker = {"model": model, "step": step, "hf_checkpoint": hf_checkpoint, "task": task, **(extra or {})}
    path.write_text(json.dumps(marker) + "\n")
    return path
