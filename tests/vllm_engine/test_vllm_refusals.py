"""What the vLLM environment refuses before Ray starts: a checkpoint vLLM cannot load, and the CUDA
builds of the media packages next to a CPU torch (checked on fake package directories, since the
real ones are uninstalled here)."""

from __future__ import annotations

import json
import shutil

import pytest

from relax.config.run import RunConfig
from relax.rollout.engines import config_errors
from relax.rollout.vllm.environment import media_packages_error, needs_cuda_torch, unloadable_media_packages


def test_an_architecture_vllm_does_not_have_is_refused(qwen2_checkpoint, tmp_path):
    assert config_errors(RunConfig(hf_checkpoint=str(qwen2_checkpoint), rollout_engine="vllm")) == []
    odd = tmp_path / "odd"
    shutil.copytree(qwen2_checkpoint, odd)
    config = json.loads((odd / "config.json").read_text())
    config["architectures"] = ["NotARealModelForCausalLM"]
    (odd / "config.json").write_text(json.dumps(config))
    (error,) = config_errors(RunConfig(hf_checkpoint=str(odd), rollout_engine="vllm"))
    assert "vLLM cannot load --hf-checkpoint" in error and "NotARealModelForCausalLM" in error
    assert "use --rollout-engine hf" in error


def test_a_media_package_built_for_cuda_torch_is_found_without_importing_it(tmp_path, monkeypatch):
    cuda = tmp_path / "torchvision"
    (cuda / "io").mkdir(parents=True)
    (cuda / "__init__.py").write_text("raise RuntimeError('imported')\n")
    (cuda / "_C.so").write_bytes(b"\x7fELF...libc10.so\x00libtorch_cuda.so\x00...")
    cpu = tmp_path / "torchaudio"
    (cpu / "lib").mkdir(parents=True)
    (cpu / "__init__.py").write_text("raise RuntimeError('imported')\n")
    (cpu / "lib" / "_torchaudio.so").write_bytes(b"\x7fELF...libc10.so\x00libtorch_cpu.so\x00")
    assert needs_cuda_torch(cuda) and not needs_cuda_torch(cpu)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert unloadable_media_packages(torch_has_cuda=False) == ["torchvision"]
    assert unloadable_media_packages(torch_has_cuda=True) == []  # next to CUDA torch it loads
    message = media_packages_error(["torchvision"])
    assert message.startswith("--rollout-engine vllm: torchvision is a CUDA build") and \
        message.endswith("pip uninstall -y torchvision")


@pytest.mark.parametrize("names,tail", [(["torchvision", "torchcodec"], "pip uninstall -y torchvision torchcodec")])
def test_the_message_names_every_package(names, tail):
    assert media_packages_error(names).endswith(tail) and "are CUDA builds" in media_packages_error(names)
