"""The Megatron backend's CPU step-time shortcuts change nothing but time (``benchmarks/
megatron_vs_torch.py`` measures the time): each is compared bit for bit with the megatron-core code
it stands in for, in a spawned process (``_cpu_compat.apply()`` patches process-wide state).

- the inline loop that replaces ``forward_backward_no_pipelining`` at PP=1 (``_run_unpipelined``),
  against megatron-core's schedule on the same backend: three PPO steps of three micro-batches,
  clipping engaged, entropy bonus;
- the ``torch._foreach_*`` versions of megatron-core's multi-tensor fallbacks (gradient norm and
  clipping) against the originals;
- the inner ``torch.optim`` step running outside the CPU device scope;
- ``F.linear`` in place of megatron-core's linear autograd function where that has nothing to
  overlap (equal bit for bit on this machine, but one fused ``addmm`` need not round as ``matmul``
  then ``+ bias`` on every BLAS, so the check allows 1e-6);
- ``scaled_dot_product_attention`` as the core attention of the local layer spec (a different
  reduction order than ``baddbmm`` + softmax + ``bmm``: within 1e-5).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

pytestmark = [
    pytest.mark.megatron,
    pytest.mark.skipif(importlib.util.find_spec("megatron.core") is None, reason="megatron-core is not installed"),
]

from megatron_harness import run_distributed  # noqa: E402
import megatron_speed_workers as SW  # noqa: E402


@pytest.fixture(scope="module")
def out():
    return run_distributed(SW.speed_paths, 1)[0]


def _equal(a, b, path=""):
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _equal(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _equal(x, y, f"{path}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), path
    elif hasattr(a, "__attrs_attrs__"):
        for field in a.__attrs_attrs__:
            _equal(getattr(a, field.name), getattr(b, field.name), f"{path}.{field.name}")
    else:
        assert a == b, (path, a, b)


@pytest.mark.timeout(240)
def test_inline_pp1_loop_is_bit_identical_to_megatron_schedule(out):
    inline, schedule = out["runs"]["inline"], out["runs"]["schedule"]
    assert inline["metrics"][0]["grad_norm"] > 1.0  # clipping engaged
    for key in ("log_probs", "entropy", "metrics", "grads", "trained", "exp_avg_sq", "log_probs_after"):
        _equal(inline[key], schedule[key], key)


@pytest.mark.timeout(240)
def test_foreach_fallbacks_equal_megatron_originals(out):
    assert out["patched"] == (True, True, True)
    expected, got = out["norms"]
    assert torch.equal(expected, got) and got.dtype == torch.float32 and got.shape == (1,)
    for a, b in zip(*out["scaled"]):
        assert torch.equal(a, b)
    assert out["into_bf16_exact"]  # the bf16 optimizer's master -> parameter copy


@pytest.mark.timeout(240)
def test_inner_optimizer_step_runs_outside_the_device_scope(out):
    for run in out["runs"].values():
        assert run["modes"] and set(run["modes"]) == {"NoneType"}, run["modes"]
    # inside the wrapped call the scope is popped; after it, it is back
    assert out["unscoped_modes"] == ["NoneType", "_CudaToCpuMode"]


@pytest.mark.timeout(240)
def test_plain_linear_equals_megatrons_linear_and_hands_back_what_it_cannot_do(out):
    linear = out["linear"]
    assert linear["installed"]
    # outputs and input / weight / bias gradients, relative to the largest magnitude
    assert linear["max_rel_diff"][True] < 1e-6 and linear["max_rel_diff"][False] < 1e-6, linear["max_rel_diff"]
    # fused gradient accumulation, a tensor-parallel gradient all-reduce, sequence parallelism
    assert linear["handed_back"] == [True, True, True]
    assert linear["calls"] == [(True, False, False), (False, True, False), (False, False, True)]


@pytest.mark.timeout(240)
def test_sdpa_core_attention_equals_megatrons_dot_product_attention(out):
    # 4 key/value groups: multi-head attention; 2: grouped-query (two query heads per key/value head)
    assert set(out["attention"]) == {4, 2}
    for groups, diff in out["attention"].items():
        assert diff < 1e-5, (groups, diff)
