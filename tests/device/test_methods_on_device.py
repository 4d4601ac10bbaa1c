"""Every built-in method's three stages (rewards -> advantages -> loss) and its gradient with every
input on a second device: each output is made on the device of the inputs it meets (a CPU tensor
made inside a method, e.g. with ``torch.zeros(n)``, fails here as it would on a GPU), and equals the
CPU's result."""

from __future__ import annotations

import pytest
import torch
from device_emulation import DEVICE, cpu_data, on_device, on_the_cpu

from relax.algorithms import AdvantageInputs, PolicyLossInputs, algorithm_names, get_algorithm
from relax.algorithms.gdpo import PRESET_NAMES

N, T, GROUP = 8, 6, 4


def _inputs(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([6, 3, 1, 5, 4, 6, 2, 5])
    mask = torch.arange(T)[None, :] < lengths[:, None]
    old = -torch.rand((N, T), generator=g, dtype=torch.float64).float() * 2 * mask
    return {
        "raw_rewards": torch.rand((N, 2), generator=g, dtype=torch.float64),  # two components, as a rollout scores
        "group_ids": torch.arange(N) // GROUP + 7,
        "mask": mask,
        "values": torch.randn((N, T), generator=g) * mask,
        "kl": torch.rand((N, T), generator=g) * 0.1 * mask,
        "old": old,
        "new": old + torch.randn((N, T), generator=g) * 0.2 * mask,
        "ref": old + torch.randn((N, T), generator=g) * 0.1 * mask,
        "rollout": old + torch.randn((N, T), generator=g) * 0.1 * mask,
        "entropy": torch.rand((N, T), generator=g) * mask,
        "teacher": old + torch.randn((N, T), generator=g) * 0.3 * mask,  # read by a method that needs a teacher
        # the teacher's and the student's distributions over 4 tokens (GKD's loss reads them)
        "teacher_top": torch.randn((N, T, 4), generator=g),
        "student_top": torch.randn((N, T, 4), generator=g),
    }


def _three_stages(name: str, x: dict[str, torch.Tensor], **settings):
    """normalize_rewards, compute_advantages (KL in the reward, and values for a critic method),
    policy_loss (every optional input given) and the gradient of the loss w.r.t. the new log-probs."""
    cls = get_algorithm(name)
    algo = cls(cls.Config(reward_keys=("a", "b"), n_samples_per_prompt=GROUP, kl_coef=0.05, use_kl_loss=True,
                          kl_loss_coef=0.1, entropy_coef=0.01, **settings))
    rewards = algo.normalize_rewards(x["raw_rewards"], x["group_ids"])
    signal = algo.group_has_signal(x["raw_rewards"], x["group_ids"])
    advantages, returns = algo.compute_advantages(AdvantageInputs(
        rewards=rewards.float(), response_mask=x["mask"], values=x["values"] if algo.needs_critic else None,
        kl=x["kl"], segment_sizes=(GROUP, N - GROUP)))
    new = x["new"].clone().requires_grad_(True)
    # the student's distribution moves with its log-probs, so a divergence loss has a gradient w.r.t. them too
    student_top = (x["student_top"] + new.unsqueeze(-1)).log_softmax(-1)
    out = algo.policy_loss(PolicyLossInputs(
        log_probs=new, old_log_probs=x["old"], advantages=advantages, response_mask=x["mask"],
        ref_log_probs=x["ref"], rollout_log_probs=x["rollout"], entropy=x["entropy"], teacher_log_probs=x["teacher"],
        teacher_top_log_probs=x["teacher_top"].log_softmax(-1), student_top_log_probs=student_top,
        global_num_tokens=float(x["mask"].sum()), global_num_sequences=float(N), max_response_length=T))
    out.loss.backward()
    return {"rewards": rewards, "signal": signal, "advantages": advantages, "returns": returns, "loss": out.loss,
            "grad": new.grad}, out.metrics


# every registered method, and GDPO's reference presets (their own arithmetic, step by step)
CASES = [(name, {}) for name in algorithm_names()] + [("gdpo", {"gdpo_preset": p}) for p in PRESET_NAMES]


@pytest.mark.parametrize(("name", "settings"), CASES, ids=[n + "".join(f"-{v}" for v in s.values()) for n, s in CASES])
def test_method_on_the_device_makes_its_tensors_there_and_matches_the_cpu(device, name, settings):
    x = _inputs()
    with on_the_cpu():
        expected, expected_metrics = _three_stages(name, x, **settings)
    got, metrics = _three_stages(name, {k: v.to(DEVICE) for k, v in x.items()}, **settings)
    for key, value in got.items():
        assert on_device(value), f"{name}: {key} left the device"
        torch.testing.assert_close(cpu_data(value), expected[key], rtol=1e-5, atol=1e-6, msg=f"{name}: {key}")
    assert metrics.keys() == expected_metrics.keys()
    for key, value in expected_metrics.items():
        assert float(metrics[key]) == pytest.approx(float(value), rel=1e-5, abs=1e-7), f"{name}: {key}"


def test_off_policy_weight_metrics_are_computed_on_the_models_device(device, monkeypatch):
    """The ``off_policy/*`` units are gathered over the data-parallel group, which on GPUs is NCCL's
    and takes device tensors only: they are made on the model's device (a rank without rows too)."""
    from relax.algorithms import AlgorithmConfig, numerics
    from relax.runtime.metrics import actor_metrics

    seen = []

    def gather(local, process_group=None, **kwargs):  # the collective's view of what it is handed
        seen.append(on_device(local))
        return local, 0

    monkeypatch.setattr(numerics, "all_gather_rows", gather)
    x = _inputs()

    class Batch:
        response_mask = x["mask"]

    shard = {"batch": Batch(), "old_log_probs": x["old"], "fields": {"rollout_log_probs": x["rollout"]}}
    config = AlgorithmConfig(off_policy_correction="tis", off_policy_cap=1.5)
    with on_the_cpu():
        expected = actor_metrics.off_policy_weight_metrics(shard, config)
    got = actor_metrics.off_policy_weight_metrics(shard, config, device=DEVICE)
    assert seen == [False, True]  # the CPU reference's units on the CPU, the device run's on the device
    assert got == {k: pytest.approx(v, rel=1e-6) for k, v in expected.items()}
    actor_metrics.off_policy_weight_metrics({"batch": None, "fields": {}}, config, device=DEVICE)
    assert seen[-1] is True
