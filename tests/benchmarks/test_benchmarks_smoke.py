"""Every script in benchmarks/ runs: each once with ``--smoke`` (a few steps or a tiny model), so a
change that breaks a benchmark fails the suite. Nothing here reads a timing: the numbers the
benchmarks exist for are ratios measured by running them (docs), never asserted in tests."""

from __future__ import annotations

import math
import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
# Every script in benchmarks/, by the name its test below runs it with.
SCRIPTS = {
    "algorithms": "benchmarks/algorithms.py",
    "async": "benchmarks/async.py",
    "in_process": "benchmarks/in_process.py",
    "gpu": "benchmarks/gpu.py",
    "gpu_vllm": "benchmarks/gpu_vllm.py",
    "hf_rollout": "benchmarks/hf_rollout.py",
    "megatron_vs_torch": "benchmarks/megatron_vs_torch.py",
    "memory": "benchmarks/memory.py",
    "packing": "benchmarks/packing.py",
    "pipeline": "benchmarks/pipeline.py",
    "rollout_engines": "benchmarks/rollout_engines.py",
    "startup": "benchmarks/startup.py",
    "weight_transport": "benchmarks/weight_transport.py",
}


def smoke(name: str, monkeypatch, *extra: str):
    """Load the benchmark script ``SCRIPTS[name]`` as a module and run its ``main(["--smoke", *extra])``."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # the scripts import each other (in_process)
    module = runpy.run_path(str(ROOT / SCRIPTS[name]), run_name=f"benchmark_{name}")
    return module["main"](["--smoke", *extra])


def test_every_benchmark_has_a_smoke_test():
    assert {f"benchmarks/{p.name}" for p in BENCHMARKS.glob("*.py")} == set(SCRIPTS.values())


def test_in_process(monkeypatch):
    summary = smoke("in_process", monkeypatch)
    assert summary["steps"] == 3 and 0.0 <= summary["greedy_accuracy_100"] <= 1.0


def test_algorithms(monkeypatch, capsys):
    smoke("algorithms", monkeypatch)
    out = capsys.readouterr().out
    for op in ("grpo_normalize", "gdpo_normalize", "gdpo_whiten"):
        assert sum(line.startswith(op) for line in out.splitlines()) == 1, out  # N = 10^3 only


@pytest.mark.timeout(400)
def test_gpu(monkeypatch):
    """The GPU check's every phase on a tiny shape on the CPU: the train step three ways on the same
    batch, the engine benchmark, two runs trained in one process each and the rest validated."""
    pytest.importorskip("transformers")
    pytest.importorskip("peft")  # the LoRA run's flags
    summary = smoke("gpu", monkeypatch)
    step = summary["train_step"]
    assert step["real_tokens"] < step["padded_tokens"]  # the responses' lengths are spread
    assert all(step[way]["tokens_per_s"] > 0 for way in ("bare", "padded", "packed"))
    assert summary["engine"]["rc"] == 0 and summary["engine"]["tokens_per_s"]["hf_engine"] > 0
    runs = summary["runs"]
    assert set(runs) == {"default", "torch_bf16", "torch_bf16_packed", "megatron_bf16", "lora_reward_model",
                         "torch_bf16_in_process", "torch_bf16_collective"}
    assert all(r["rc"] == 0 for r in runs.values() if "skipped" not in r), runs
    for trained in ("default", "torch_bf16"):
        assert runs[trained]["steps"] == 3 and runs[trained]["train_tokens_per_s"] > 0, runs[trained]
        assert runs[trained]["actor_gpu_peak_mib"] is None  # no GPU touched on the CPU


def test_hf_rollout(monkeypatch):
    pytest.importorskip("transformers")
    result = smoke("hf_rollout", monkeypatch)
    assert result["decoding"] == "dynamic cache"  # the CPU default
    assert set(result["tokens_per_s"]) == {"hf_engine", "generate", "generate_with_scores"}
    assert all(v > 0 for v in result["tokens_per_s"].values())
    # the static-cache path (what CUDA graphs replay on a GPU) is timed against the dynamic one
    result = smoke("hf_rollout", monkeypatch, "--decoding", "static")
    assert result["decoding"] == "static cache" and result["ratio_vs_dynamic"] > 0
    assert set(result["tokens_per_s"]) == {"hf_engine", "hf_engine_dynamic", "generate", "generate_with_scores"}


@pytest.mark.timeout(420)  # six processes, two of them the ranks of the sharded configuration
def test_memory(monkeypatch):
    pytest.importorskip("transformers")
    pytest.importorskip("peft")  # the LoRA configuration
    results = smoke("memory", monkeypatch)
    assert [r["config"] for r in results] == ["fp32", "bf16", "recompute", "bf16+recompute", "lora", "fsdp x2"]
    assert all(r["peak_mib"] > 0 and r["step_s"] > 0 for r in results)
    fp32, sharded = results[0], results[-1]
    assert sharded["adam_mib"] < fp32["adam_mib"] and sharded["param_mib"] < fp32["param_mib"]


def test_packing(monkeypatch):
    pytest.importorskip("transformers")
    result = smoke("packing", monkeypatch)
    assert result["packed_micro_batches"] >= 1 and result["real_tokens"] < result["padded_tokens"]
    assert result["padded_step_s"] > 0 and result["packed_step_s"] > 0
    assert result["max_grad_rel_diff"] < 1e-4  # the same step, up to the order of the float sums


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_startup(monkeypatch):
    result = smoke("startup", monkeypatch)  # one cold run, one on a kept `relax cluster up` cluster, one in-process
    assert len(result["cold"]) == 1 and len(result["warm"]) == 1
    for run in result["cold"] + result["warm"]:
        assert run["startup_s"] > 0 and {"ray_s", "transferqueue_s", "workers_ready_s"} <= set(run["phases"])
    assert not result["cold"][0]["pre_started_workers"] and result["warm"][0]["pre_started_workers"]
    (local,) = result["in_process"]  # relax train --in-process: no Ray, TransferQueue or Serve phase
    assert local["startup_s"] > 0 and "workers_ready_s" in local["phases"] and "ray_s" not in local["phases"]


@pytest.mark.megatron
def test_megatron_vs_torch(monkeypatch):
    pytest.importorskip("megatron.core")
    result = smoke("megatron_vs_torch", monkeypatch)
    assert result["train_step_ratio"] > 0 and result["log_probs_ratio"] > 0


@pytest.mark.vllm
@pytest.mark.timeout(600)
def test_rollout_engines(monkeypatch):
    pytest.importorskip("vllm")
    result = smoke("rollout_engines", monkeypatch)
    assert result["hf_tokens_per_s"] > 0 and result["vllm_tokens_per_s"] > 0


@pytest.mark.vllm
@pytest.mark.timeout(600)
def test_gpu_vllm(monkeypatch):
    """The GPU script's rollout measurement, on a tiny model on this machine's device."""
    pytest.importorskip("vllm")
    result = smoke("gpu_vllm", monkeypatch)
    assert result["float32_hf_tokens_per_s"] > 0 and result["float32_vllm_tokens_per_s"] > 0


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_pipeline(ray_cluster, monkeypatch):
    result = smoke("pipeline", monkeypatch)
    assert result["steps"] == 3 and result["runtime_step_ms"] > 0
    assert "time/step_s" in result["runtime_breakdown_median_ms"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_async(ray_cluster, monkeypatch):
    result = smoke("async", monkeypatch)
    assert set(result["runs"]) == {"bare_sync", "runtime_sync", "async_k1", "async_k1_2_rollout_workers"}
    assert all(math.isfinite(r["step_ms"]) for r in result["runs"].values())
    assert result["runs"]["async_k1"]["staleness_max"] <= 1


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_weight_transport(ray_cluster, monkeypatch):
    result = smoke("weight_transport", monkeypatch)
    assert set(result["runs"]) == {f"{t}_{w}w" for t in ("object-store", "collective") for w in (1, 2)}
    assert all(r["publish_s"] > 0 for r in result["runs"].values())
    assert result["identical"] is True  # both transports delivered the same bytes to every worker
