"""The frozen teacher of a distillation method (``--teacher-checkpoint``): what the path holds, the
model it loads, and whether its tokenizer is the student's.

A teacher comes in one of three forms:

- a Hugging Face model directory (``config.json`` beside the weights), with ``--hf-checkpoint``;
- a relax run checkpoint: a ``state.pt``, a ``checkpoints/step_*`` directory or a run directory (its
  newest checkpoint). With ``--hf-checkpoint`` the checkpoint's ``hf/`` export is the teacher; with the
  built-in tiny model the trained weights inside ``state.pt`` are loaded into the student's
  architecture;
- with the built-in tiny model, a tiny checkpoint file (the format of the shipped warm-up,
  ``relax.models.tiny.weights``).

A teacher only makes sense when it reads and writes the student's token ids: its log-prob of a token
id must be the probability of the same text. ``tokenizer_mismatch`` compares the two before any
worker starts.
"""

from __future__ import annotations

from pathlib import Path

import attrs
import torch
from torch import nn

from relax.config.run import RunConfig
from relax.models.checkpoint_paths import STATE_FILE, checkpoint_state, policy_weights

FLAG = "--teacher-checkpoint"
HF, TINY, RUN = "hf", "tiny", "run"  # the forms a teacher checkpoint takes


@attrs.frozen
class TeacherSource:
    """Where the teacher's weights are: ``kind`` is ``hf`` (``path``: a Hugging Face directory),
    ``tiny`` (``path``: a tiny checkpoint file) or ``run`` (``path``: a relax run's ``state.pt``
    holding tiny weights)."""

    kind: str
    path: Path

    def describe(self) -> str:
        return {HF: "Hugging Face model", TINY: "tiny model checkpoint", RUN: "relax run checkpoint"}[self.kind] + (
            f" {self.path}")


class TeacherCheckpointError(ValueError):
    """``--teacher-checkpoint`` names nothing a teacher can be loaded from."""


def _run_state(path: Path) -> Path | None:
    """The ``state.pt`` a relax run path stands for (the newest checkpoint of a run directory)."""
    if path.is_file() and path.name != STATE_FILE:
        return None  # a tiny model's own file (the warm-up format), not a run's
    return checkpoint_state(path)


def resolve_teacher(path: str, *, student_is_hf: bool) -> TeacherSource:
    """What ``--teacher-checkpoint path`` holds; ``TeacherCheckpointError`` naming the flag when it
    is nothing a teacher can be loaded from for this student."""
    p = Path(path).expanduser()
    if not p.exists():
        raise TeacherCheckpointError(f"{FLAG} {path} does not exist; pass the teacher's checkpoint directory")
    state = _run_state(p)
    if p.is_dir() and (p / "config.json").is_file():
        source = TeacherSource(HF, p)
    elif state is not None and (state.parent / "hf" / "config.json").is_file():
        source = TeacherSource(HF, state.parent / "hf")  # an HF run's checkpoint: its export
    elif state is not None:
        source = TeacherSource(RUN, state)
    elif p.is_file():
        source = TeacherSource(TINY, p)
    else:
        raise TeacherCheckpointError(
            f"{FLAG} {path} is neither a Hugging Face model directory (config.json) nor a relax run checkpoint "
            "(state.pt, checkpoints/step_*/state.pt); pass one of those"
        )
    if student_is_hf and source.kind != HF:
        raise TeacherCheckpointError(
            f"{FLAG} {path} holds a {source.describe()} for the built-in tiny model, but the student is the "
            "--hf-checkpoint model: the teacher must be a Hugging Face model with the student's tokenizer"
        )
    if not student_is_hf and source.kind == HF:
        raise TeacherCheckpointError(
            f"{FLAG} {path} is a Hugging Face model, but the student is the built-in tiny model (no "
            "--hf-checkpoint): its tokenizer is not the tiny vocabulary. Pass a tiny teacher (a relax run "
            "checkpoint of the built-in task) or train a --hf-checkpoint student"
        )
    return source


def _tiny_state(source: TeacherSource) -> dict:
    """``{"config": ..., "model": ...}`` of a tiny teacher (a run checkpoint's weights keep the
    student's architecture: ``config`` is None then)."""
    try:
        state = torch.load(source.path, map_location="cpu", weights_only=source.kind == TINY)
    except Exception as exc:  # noqa: BLE001 - truncated, not a torch file: one line naming the flag
        raise TeacherCheckpointError(
            f"{FLAG} {source.path}: not a readable checkpoint ({type(exc).__name__}: {str(exc).splitlines()[0]})"
        ) from None
    if source.kind == RUN:
        try:
            return {"config": None, "model": policy_weights(state)}
        except (KeyError, TypeError):
            raise TeacherCheckpointError(
                f"{FLAG} {source.path}: not a relax run checkpoint (no actor weights); pass the state.pt "
                "that relax train --save-interval writes"
            ) from None
    if not (isinstance(state, dict) and "config" in state and "model" in state):
        raise TeacherCheckpointError(
            f"{FLAG} {source.path}: not a tiny model checkpoint (expected the warm-up format, a dict with "
            "'config' and 'model') nor a relax run checkpoint"
        )
    return state


def teacher_vocab_size(source: TeacherSource) -> int:
    """The vocabulary size of a tiny teacher (a run checkpoint's: its token embedding's rows)."""
    state = _tiny_state(source)
    if state["config"] is not None:
        return int(state["config"]["vocab_size"])
    return int(state["model"]["tok_emb.weight"].shape[0])


def load_teacher_model(config: RunConfig, student: nn.Module | None = None, *, device=None) -> nn.Module:
    """The frozen teacher for ``config.teacher_checkpoint``, float32, in eval mode, on ``device``.

    ``student``: a module of the student's architecture, only needed for a tiny run checkpoint (its
    weights are loaded into a fresh copy of it)."""
    from relax.models.factory import default_device

    device = device or default_device()
    source = resolve_teacher(config.teacher_checkpoint, student_is_hf=bool(config.hf_checkpoint))
    if source.kind == HF:
        from relax.models.hf.loading import load_hf_model

        model = load_hf_model(source.path, dtype=torch.float32, device=device, flag=FLAG)
    else:
        from relax.models.tiny.model import TinyCausalLM, TinyLMConfig

        state = _tiny_state(source)
        if state["config"] is not None:
            model = TinyCausalLM(TinyLMConfig(**state["config"]))
        else:
            if student is None:
                raise ValueError("a tiny run checkpoint teacher needs the student's module (its architecture)")
            import copy

            model = copy.deepcopy(student).cpu()
        try:
            model.load_state_dict(state["model"])
        except RuntimeError as exc:
            raise TeacherCheckpointError(
                f"{FLAG} {source.path}: its weights do not fit the tiny model ({str(exc).splitlines()[0]}); "
                "the teacher must be a checkpoint of the same built-in task's model"
            ) from None
        model = model.to(device)
    model.requires_grad_(False)
    return model.eval()


def tokenizer_mismatch(config: RunConfig, student_tokenizer) -> str | None:
    """Why the teacher's tokenizer is not the student's (None: it is). Names both."""
    source = resolve_teacher(config.teacher_checkpoint, student_is_hf=bool(config.hf_checkpoint))
    if source.kind != HF:
        size = teacher_vocab_size(source)
        if size != student_tokenizer.vocab_size:
            return (f"{FLAG} {config.teacher_checkpoint} has a {size}-token vocabulary, but the student's "
                    f"(--task {config.task}) tokenizer has {student_tokenizer.vocab_size} tokens: a teacher of "
                    "another built-in task cannot score this task's tokens")
        return None
    from relax.models.hf.loading import load_hf_tokenizer

    teacher = load_hf_tokenizer(source.path)
    mine, theirs = student_tokenizer.hf, teacher.hf
    differences = []
    if mine.get_vocab() != theirs.get_vocab():
        differences.append(f"vocabulary ({len(mine)} vs {len(theirs)} tokens, or ids that differ)")
    for name in ("eos_token_id", "bos_token_id", "pad_token_id"):
        if getattr(mine, name, None) != getattr(theirs, name, None):
            differences.append(f"{name} ({getattr(mine, name, None)} vs {getattr(theirs, name, None)})")
    if not differences:
        return None
    return (f"the teacher's tokenizer ({FLAG} {config.teacher_checkpoint}) is not the student's "
            f"(--hf-checkpoint {config.hf_checkpoint}): {', '.join(differences)} differ (student vs teacher); a "
            "teacher must score the student's token ids, so use a teacher of the same tokenizer family")
