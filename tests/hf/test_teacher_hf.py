"""A Hugging Face teacher (``--teacher-checkpoint``) for a ``--hf-checkpoint`` student: accepted with the
student's tokenizer, refused before any worker starts with another one (naming both), and loaded
frozen from the directory or from a relax run checkpoint's ``hf/`` export."""

from __future__ import annotations

import shutil

import pytest

from relax.config.run import RunConfig
from relax.models.hf.loading import load_hf_tokenizer
from relax.models.teacher import load_teacher_model
from relax.runtime.preflight.common import PreflightError
from relax.runtime.preflight.teacher import check_teacher


def _config(student, teacher) -> RunConfig:
    return RunConfig(advantage_estimator="on-policy-distill", hf_checkpoint=str(student), teacher_checkpoint=str(teacher))


def test_a_teacher_with_the_students_tokenizer_is_accepted_and_loaded_frozen(checkpoints, tmp_path):
    student, teacher = checkpoints["llama"], checkpoints["llama-tied"]  # one tokenizer, other weights
    check_teacher(_config(student, teacher), load_hf_tokenizer(student))
    # a relax run checkpoint of an HF run: its hf/ export is the teacher
    step = tmp_path / "run" / "checkpoints" / "step_000002"
    step.mkdir(parents=True)
    (step / "state.pt").write_bytes(b"")
    shutil.copytree(teacher, step / "hf")
    model = load_teacher_model(_config(student, tmp_path / "run"), device="cpu")
    assert model.config.tie_word_embeddings and not model.training
    assert not any(p.requires_grad for p in model.parameters())


def test_a_teacher_with_another_tokenizer_is_refused_naming_both(checkpoints, tmp_path):
    student = checkpoints["llama"]
    other = tmp_path / "other"
    shutil.copytree(checkpoints["llama-tied"], other)
    tokenizer = load_hf_tokenizer(other).hf
    tokenizer.add_tokens(["<tool>"])
    tokenizer.save_pretrained(str(other))
    with pytest.raises(PreflightError) as err:
        check_teacher(_config(student, other), load_hf_tokenizer(student))
    message = str(err.value)
    assert f"--teacher-checkpoint {other}" in message and f"--hf-checkpoint {student}" in message
    assert "vocabulary" in message
