"""The actor rank's whole step (old and reference log-probs, the advantages from the Serve role or
computed on the rank, the optimizer steps, the weights handed to the rollout) with the policy on a
second device while the step's samples come from the data plane on the CPU: the H200's failures
(``Expected all tensors to be on the same device`` in the loss, ``indices should be either on cpu
...`` with packed micro-batches) fail these tests, and the numbers must equal the CPU run's up to rounding."""

from __future__ import annotations

import pytest
import torch
from device_emulation import cpu_data, on_device, on_the_cpu
from device_steps import write_step

from relax.algorithms import AlgorithmConfig
from relax.config.run import RunConfig
from relax.models.factory import build_policy_model
from relax.runtime.data.memory_plane import MemoryDataPlane
from relax.runtime.step.actor_worker import ActorCore
from relax.runtime.step.advantages import AdvantagesCore

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture(scope="module")
def hf_checkpoint(tmp_path_factory):
    from relax.models.hf.tiny_random import build_tiny_random_checkpoint

    return str(build_tiny_random_checkpoint(tmp_path_factory.mktemp("tiny") / "qwen2", "qwen2", hidden=32, layers=1))


def _config(algo: str, hf: str | None, **kw) -> RunConfig:
    return RunConfig(advantage_estimator=algo, hf_checkpoint=hf,
                     algorithm=kw.pop("config_cls", AlgorithmConfig)(reward_keys=("a", "b"), n_samples_per_prompt=4, **kw.pop("algo_kw", {})),
                     rollout_batch_size=4, num_steps_per_rollout=2, seed=3, lr=1e-4, **kw,
                     adam_eps=1e-3)  # Adam turns rounding-level gradients (an exactly-zero one) into steps of lr: not here


def _actor_step(config: RunConfig, *, on_actor: bool, reference: bool = False, rollout_log_probs: bool = False,
                teacher: bool = False):
    """One training step of an ``ActorCore`` on a fresh step; returns its metrics and weights."""
    plane = MemoryDataPlane()
    plan = write_step(plane, 1, rollout_log_probs=rollout_log_probs)
    if not on_actor:
        AdvantagesCore(config.advantage_estimator, config.algorithm, plane).compute(
            1, plan.num_groups, plan.segment_sizes, False, reference, plan.uids)
    actor = ActorCore(config, config.advantage_estimator, with_reference=reference, advantages_on_actor=on_actor,
                      data_plane=plane, with_teacher=teacher)
    if reference:
        actor.prepare(1, plan)
    metrics, weights = actor.train(1, plan)
    return actor, plane, metrics, weights


def _same_step(config: RunConfig, device, **kw):
    """The step on the emulated device, then on the CPU: the same metrics and weights."""
    actor, plane, metrics, weights = _actor_step(config, **kw)
    assert on_device(next(actor.model.parameters())), "the factory places the policy on the worker's device"
    assert all(not on_device(w) and w.device.type == "cpu" for w in weights.values()), "weights leave on the CPU"
    for step in plane.steps.values():  # what the rank wrote back (the reward-side kl) is on the CPU
        for group in step["groups"].values():
            assert not any(on_device(v) for v in group.values())
    with on_the_cpu():
        _, _, cpu_metrics, cpu_weights = _actor_step(config, **kw)
    # Equal up to rounding: torch decomposes some operations (attention, multi-tensor AdamW and norms)
    # differently for a wrapper tensor than for a CPU tensor, so sums run in other orders.
    assert metrics.keys() == cpu_metrics.keys()
    for key, value in cpu_metrics.items():
        if not key.startswith("time/") and key != "_actor_step_metrics":
            assert metrics[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    moved = 0
    with on_the_cpu():
        initial = build_policy_model(config).state_dict()
    for name, value in cpu_weights.items():
        torch.testing.assert_close(cpu_data(weights[name]), value, rtol=1e-5, atol=1e-6, msg=name)
        moved += not torch.equal(value, initial[name])
    assert moved, "the step updated the weights"


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("on_actor", [False, True], ids=["serve_advantages", "actor_advantages"])
def test_hf_policy_step_on_the_device_matches_the_cpu(device, hf_checkpoint, packed, on_actor):
    config = _config("gdpo", hf_checkpoint, micro_batch_size=3, max_tokens_per_micro_batch=24 if packed else None)
    _same_step(config, device, on_actor=on_actor)


def test_builtin_policy_step_with_reference_and_engine_log_probs_on_the_device(device):
    config = _config("grpo", None, algo_kw={"use_kl_loss": True, "kl_loss_coef": 0.1})
    _same_step(config, device, on_actor=True, reference=True, rollout_log_probs=True)


def test_hf_reference_pass_packed_with_reward_side_kl_on_the_device(device, hf_checkpoint):
    config = _config("reinforce_plus_plus", hf_checkpoint, max_tokens_per_micro_batch=20, algo_kw={"kl_coef": 0.05})
    _same_step(config, device, on_actor=True, reference=True)


@pytest.fixture(scope="module")
def hf_teacher(tmp_path_factory):
    """Another random qwen2 model with the same tokenizer: a teacher that disagrees with the student."""
    from relax.models.hf.tiny_random import build_tiny_random_checkpoint

    return str(build_tiny_random_checkpoint(tmp_path_factory.mktemp("teacher") / "qwen2", "qwen2", hidden=32, layers=1,
                                            seed=5))


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_hf_teacher_pass_and_distillation_step_on_the_device(device, hf_checkpoint, hf_teacher, packed):
    """The teacher role on the actor rank: the teacher sits on the policy's device and its log-probs
    meet the policy's there (padded and packed micro-batches); the step equals the CPU's."""
    from relax.algorithms.distill import OnPolicyDistill

    config = _config("on-policy-distill", hf_checkpoint, teacher_checkpoint=hf_teacher, config_cls=OnPolicyDistill.Config,
                     micro_batch_size=3, max_tokens_per_micro_batch=24 if packed else None)
    _same_step(config, device, on_actor=True, teacher=True)
    actor, _, metrics, _ = _actor_step(config, on_actor=True, teacher=True)
    assert on_device(next(actor.teacher.model.parameters()))
    assert metrics["distill/reverse_kl"] != 0.0 and metrics["time/actor/teacher_s"] > 0
