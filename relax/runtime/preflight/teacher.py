"""Pre-flight of ``--teacher-checkpoint``: something a teacher loads from, for this student, with the
student's tokenizer (``relax.models.teacher``). A tiny teacher is loaded once here (it takes
milliseconds), so that weights that do not fit the task's model fail before any worker starts."""

from __future__ import annotations

from relax.config.run import RunConfig
from relax.runtime.preflight.common import PreflightError, first_line, quiet
from relax.runtime.preflight.model import check_hf_dir


def check_teacher(config: RunConfig, student_tokenizer) -> None:
    """The teacher's checkpoint resolves, its weights are there and its tokenizer is the student's."""
    if not config.teacher_checkpoint:
        return
    from relax.models.teacher import FLAG, HF, TeacherCheckpointError, resolve_teacher, tokenizer_mismatch

    try:
        source = resolve_teacher(config.teacher_checkpoint, student_is_hf=bool(config.hf_checkpoint))
        if source.kind == HF:
            check_hf_dir(str(source.path), FLAG)
        with quiet():
            problem = tokenizer_mismatch(config, student_tokenizer)
        if source.kind != HF and not problem:
            from relax.models.factory import build_policy_model
            from relax.models.teacher import load_teacher_model

            load_teacher_model(config, build_policy_model(config, device="cpu"), device="cpu")
    except (TeacherCheckpointError, OSError, ValueError) as exc:
        message = first_line(exc).splitlines()[0]
        raise PreflightError(message if FLAG in message else f"{FLAG} {config.teacher_checkpoint}: {message}") from None
    if problem:
        raise PreflightError(problem)
