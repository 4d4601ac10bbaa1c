"""The teacher role with ``--backend megatron``: the teacher pass is plain torch whatever the backend
trains the policy, and an actor's distillation step gives the torch backend's numbers (float32
rounding)."""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = [
    pytest.mark.megatron,
    pytest.mark.skipif(importlib.util.find_spec("megatron.core") is None, reason="megatron-core is not installed"),
]

import teacher_workers as W
from megatron_harness import run_distributed


@pytest.mark.timeout(240)
def test_distillation_step_with_megatron_matches_the_torch_backend(tmp_path):
    teacher = W.sharper_teacher(str(tmp_path / "teacher.pt"))
    metrics = run_distributed(W.distill_step_per_backend, 1, teacher)[0]
    torch_, megatron = metrics["torch"], metrics["megatron"]
    assert torch_["distill/reverse_kl"] > 0.05  # the teacher disagrees with the student: there is something to distill
    torch_.pop("actor/optimizer_state_mib")  # a size only the torch backend reports
    assert megatron.keys() == torch_.keys()
    for key, value in torch_.items():
        assert megatron[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
