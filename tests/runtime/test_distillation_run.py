"""``--advantage-estimator on-policy-distill --teacher-checkpoint`` through ``run`` (what ``relax
train`` calls): the teacher role scores the student's samples on the actor rank and its signal
trains the student, in process on the built-in task, and on Ray with the usual capabilities
(several rollout workers, ``--fully-async`` with staleness, multi-turn episodes)."""

from __future__ import annotations

import pytest
import torch
from run_results import checkpoint_weights, training_rows

from relax.algorithms.distill import OnPolicyDistill
from relax.config.run import RunConfig
from relax.models.tiny.calculator import CHECKPOINT as CALCULATOR_CHECKPOINT
from relax.models.tiny.weights import CHECKPOINT, load_warmup_model
from relax.rollout.tasks import get_task
from relax.runtime.driver.train import run


def _sharper(source, out):
    """A teacher of the same task that is not the student: its warm-up with a sharper output layer."""
    state = torch.load(source, weights_only=True)
    state["model"] = {k: v * 2.0 if k == "ln_f.weight" else v for k, v in state["model"].items()}
    torch.save(state, out)
    return str(out)


def _config(out, teacher, task="addition", **kw) -> RunConfig:
    algorithm = OnPolicyDistill.Config(reward_keys=get_task(task).reward_keys, n_samples_per_prompt=4,
                                       **kw.pop("algorithm", {}))
    settings = {"rollout_batch_size": 4, "num_steps_per_rollout": 2, "num_rollout": 3, "seed": 5, "progress": False}
    return RunConfig(advantage_estimator="on-policy-distill", algorithm=algorithm, task=task, teacher_checkpoint=teacher,
                     output_dir=str(out), **{**settings, **kw})


def _moved(weights, initial) -> bool:
    return any(not torch.equal(initial[k], v) for k, v in weights.items())


@pytest.mark.timeout(300)
def test_run_distills_the_builtin_task_in_process(tmp_path):
    teacher = _sharper(CHECKPOINT, tmp_path / "teacher.pt")
    out = tmp_path / "run"
    run(_config(out, teacher, in_process=True))
    rows = training_rows(out)
    assert [r["step"] for r in rows] == [1, 2, 3]
    # the teacher disagrees with the student on the sampled tokens, every step, and its pass is timed
    assert all(r["distill/reverse_kl"] > 0.05 and r["time/actor/teacher_s"] > 0 for r in rows)
    assert _moved(checkpoint_weights(out, 3), load_warmup_model().state_dict())
    assert "eval/pass@1" in rows[-1]  # the embedded default's held-out evaluation ran on the distilled policy


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_distillation_with_two_rollout_workers_async_and_multi_turn_episodes(ray_cluster, tmp_path):
    """The calculator task's episodes interleave the environment's replies (never scored: outside
    the loss mask) with the model's turns; two rollout workers sample one version ahead."""
    from relax.models.tiny.calculator import load_calculator_model

    teacher = _sharper(CALCULATOR_CHECKPOINT, tmp_path / "teacher.pt")
    out = tmp_path / "run"
    run(_config(out, teacher, task="calculator", rollout_num_workers=2, fully_async=True, max_staleness=1,
                algorithm={"off_policy_correction": "tis"}, save_interval=3))
    rows = training_rows(out)
    assert [r["async/staleness_max"] for r in rows] == [0, 1, 1]
    assert all(r["distill/reverse_kl"] > 0 and r["time/actor/teacher_s"] > 0 for r in rows)
    assert _moved(checkpoint_weights(out, 3), load_calculator_model().state_dict())
