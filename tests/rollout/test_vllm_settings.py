"""The vLLM engine's settings, read through the arguments it passes to ``vllm.LLM`` (vLLM itself is
replaced by a recorder: the settings are a pure function of the run and the device)."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from relax.cli.arguments import build_train_parser
from relax.cli.build import build_run_config
from relax.cli.main import main
from relax.rollout.vllm import environment
from relax.rollout.vllm.factory import (
    OWN_GPU_MEMORY_SHARE,
    SHARED_GPU_MEMORY_SHARE,
    engine_dtype,
    llm_arguments,
    memory_share,
)

pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from relax.models.hf.tiny_random import build_tiny_random_checkpoint

    return build_tiny_random_checkpoint(tmp_path_factory.mktemp("vllm_settings") / "qwen2", "qwen2")


def config(*argv):
    return build_run_config(build_train_parser().parse_args([str(a) for a in argv]))[0]


def test_cuda_graphs_on_cuda_and_eager_on_the_cpu():
    on_gpu = llm_arguments("/m", seed=1, on_cuda=True, dtype="bfloat16", memory_share=0.4)
    on_cpu = llm_arguments("/m", seed=1, on_cuda=False)
    assert on_gpu["enforce_eager"] is False and on_cpu["enforce_eager"] is True
    assert (on_gpu["dtype"], on_gpu["gpu_memory_utilization"]) == ("bfloat16", 0.4)
    assert on_gpu["logprobs_mode"] == "processed_logprobs" and on_gpu["skip_tokenizer_init"] is True


def test_bf16_training_gives_a_bf16_engine(checkpoint):
    assert engine_dtype(config("--hf-checkpoint", checkpoint, "--rollout-engine", "vllm", "--bf16")) == "bfloat16"
    assert engine_dtype(config("--hf-checkpoint", checkpoint, "--rollout-engine", "vllm")) == "float32"


def test_the_memory_share_leaves_a_colocated_actor_its_room(checkpoint):
    default = config("--hf-checkpoint", checkpoint, "--rollout-engine", "vllm")
    assert memory_share(default, 0.5) == SHARED_GPU_MEMORY_SHARE == 0.5  # one GPU, half each (relax.runtime.cluster.cluster)
    assert memory_share(default, None) == SHARED_GPU_MEMORY_SHARE  # no Ray: one process holds all
    assert memory_share(default, 1.0) == OWN_GPU_MEMORY_SHARE == 0.9
    given = config("--hf-checkpoint", checkpoint, "--rollout-engine", "vllm", "--rollout-gpu-memory-utilization", "0.3")
    assert memory_share(given, 1.0) == memory_share(given, 0.5) == 0.3


def test_the_run_reaches_vllm_LLM_with_its_settings(checkpoint, monkeypatch):
    """``relax train``'s flags -> the rollout worker's engine factory -> ``vllm.LLM(**kwargs)``."""
    from relax.rollout import factory
    from relax.rollout.vllm.engine import VLLMEngine

    seen = {}

    class RecordingLLM:
        def __init__(self, **kwargs):
            seen.update(kwargs)

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=RecordingLLM))
    monkeypatch.setattr(environment, "unloadable_media_packages", lambda: [])
    for name, value in environment.ENGINE_ENVIRONMENT.items():  # restored after the test
        monkeypatch.setenv(name, value)
    run = config("--hf-checkpoint", checkpoint, "--rollout-engine", "vllm", "--bf16",
                 "--rollout-gpu-memory-utilization", "0.35", "--seed", "7")
    engine = factory.build_engine(run)
    assert isinstance(engine, VLLMEngine)
    assert seen["model"] == str(checkpoint) and seen["seed"] == 7
    assert (seen["dtype"], seen["gpu_memory_utilization"]) == ("bfloat16", 0.35)
    assert seen["enforce_eager"] is (not torch.cuda.is_available())


def relax_train(capsys, *argv) -> tuple[int, str]:
    try:
        code = main(["train", *map(str, argv)])
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


def test_the_memory_flag_without_the_vllm_engine_is_refused(capsys, checkpoint):
    for argv in ((), ("--hf-checkpoint", checkpoint)):
        code, err = relax_train(capsys, *argv, "--rollout-gpu-memory-utilization", "0.3", "--dry-run")
        assert code != 0 and "--rollout-gpu-memory-utilization 0.3 is a setting of the vllm engine only" in err, err
    code, err = relax_train(capsys, "--rollout-gpu-memory-utilization", "1.5", "--dry-run")
    assert code != 0 and "--rollout-gpu-memory-utilization" in err, err
