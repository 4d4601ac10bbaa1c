"""``--teacher-checkpoint`` and ``--distill-coef`` on the command line: required by a method that
needs a teacher, refused by one that does not, a teacher with another tokenizer refused before
anything starts (naming both), and the distillation method's own flag parsed and checked."""

from __future__ import annotations

import pytest
import yaml

from relax.models.tiny.calculator import CHECKPOINT as CALCULATOR_CHECKPOINT
from relax.models.tiny.weights import CHECKPOINT

pytestmark = pytest.mark.real_preflight  # the tokenizer check is pre-flight's


def _refused(cli, *argv) -> str:
    code, out, err = cli("train", "--dry-run", *argv)
    assert code == 2 and out == "", err
    return err


def test_teacher_checkpoint_is_required_and_refused_by_the_capability(cli):
    err = _refused(cli, "--advantage-estimator", "on-policy-distill")
    assert "OnPolicyDistill (--advantage-estimator on-policy-distill) distills a teacher" in err
    assert "pass --teacher-checkpoint DIR" in err
    err = _refused(cli, "--teacher-checkpoint", CHECKPOINT)
    assert f"--teacher-checkpoint {CHECKPOINT} would do nothing: GRPO (--advantage-estimator grpo)" in err


def test_a_teacher_with_another_vocabulary_is_refused_before_anything_starts(cli):
    err = _refused(cli, "--advantage-estimator", "on-policy-distill", "--teacher-checkpoint", CALCULATOR_CHECKPOINT)
    assert f"--teacher-checkpoint {CALCULATOR_CHECKPOINT} has a 21-token vocabulary" in err
    assert "student's (--task addition) tokenizer has 17 tokens" in err


def test_distill_coef_is_parsed_into_the_methods_config(cli):
    code, out, err = cli("train", "--dry-run", "--advantage-estimator", "on-policy-distill", "--teacher-checkpoint",
                         CHECKPOINT, "--distill-coef", "0.25")
    assert code == 0, err
    config = yaml.safe_load(out)
    assert config["distill_coef"] == 0.25 and config["teacher_checkpoint"] == str(CHECKPOINT)
    err = _refused(cli, "--advantage-estimator", "on-policy-distill", "--teacher-checkpoint", CHECKPOINT,
                   "--distill-coef", "1.5")
    assert "--distill-coef" in err
