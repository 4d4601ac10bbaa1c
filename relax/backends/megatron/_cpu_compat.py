"""Run megatron-core on a CPU-only torch build (CI, laptops): the unavoidable patches, in one place.

megatron-core hard-codes CUDA in a handful of places that the Megatron backend reaches even with a
CPU-safe configuration (``use_cpu_initialization=True``, learned absolute positions, an explicit
attention mask, dropout 0 with the inference RNG tracker). Measured on megatron-core 0.16.1
(see ``docs/en/megatron-on-cpu.md``, "Failure ladder"):

- ``torch.cuda.current_device()`` as an allocation device: the attention scratch buffer
  (``core/utils.py`` ``GlobalMemoryBuffer``), the DDP gradient buffer (``param_and_grad_buffer.py``).
  Fix: :func:`apply` makes ``torch.cuda.current_device`` return ``"cpu"`` (process-wide, idempotent).
- ``torch.cuda.synchronize()`` after pipeline point-to-point sends (``p2p_communication.py``):
  :func:`apply` makes it a no-op (CPU collectives are synchronous).
- ``torch.cuda.get_rng_state`` / ``set_rng_state`` around a recomputed block
  (``tensor_parallel/random.py``, ``--recompute-activations``): :func:`apply` makes megatron's two
  wrappers save an empty state and restore nothing (no CUDA RNG exists; dropout is 0).
- literal ``device="cuda"`` tensors: ``FP32Optimizer._scale``, the schedule's token counter,
  ``clip_grads`` / the local multi-tensor l2-norm; and the clip-grads assertion
  ``param.grad.type() == 'torch.cuda.FloatTensor'``. Fix: :func:`cpu_device_scope`, a
  ``TorchFunctionMode`` that rewrites ``device="cuda"`` to CPU, makes ``Tensor.cuda()`` a no-op and
  reports CPU float tensors under their ``torch.cuda.*`` type names. The backend enters it around
  every call into Megatron; it is thread-local and scoped, so nothing else in the process sees it.

Nothing here runs at import. The backend calls :func:`apply` only when ``torch.cuda.is_available()``
is false. Any megatron-core other than 0.16.x raises instead of being patched blindly: the patched
call sites move between releases (0.19 needs two more patches, for example).
"""

from __future__ import annotations

import contextlib
import threading

import torch
from torch.overrides import TorchFunctionMode

TESTED_VERSIONS = ("0.16.",)  # version prefixes whose CUDA call sites this module was checked against

_lock = threading.Lock()
_applied = False
_CUDA_TYPE_NAMES = {
    torch.float32: "torch.cuda.FloatTensor",
    torch.float16: "torch.cuda.HalfTensor",
    torch.bfloat16: "torch.cuda.BFloat16Tensor",
}


class UnsupportedMegatronVersion(RuntimeError):
    pass


def check_version(version: str | None = None) -> str:
    """Return the installed megatron-core version; raise if this module was not checked against it."""
    if version is None:
        from megatron.core import __version__ as version
    if not any(version.startswith(prefix) for prefix in TESTED_VERSIONS):
        raise UnsupportedMegatronVersion(
            f"megatron-core {version} has not been tested on CPU with relax (tested: "
            f"{', '.join(p + 'x' for p in TESTED_VERSIONS)}). Its hard-coded CUDA call sites may have "
            "moved, so relax refuses to patch it. Install the tested version with "
            "`pip install 'relax-rl[megatron]'` (megatron-core==0.16.1), or run on a CUDA machine."
        )
    return version


def _cpu_current_device() -> str:
    return "cpu"


def _cpu_synchronize(device=None) -> None:
    return None


def apply() -> None:
    """Make megatron-core usable without CUDA. Idempotent; call only when CUDA is unavailable."""
    global _applied
    if torch.cuda.is_available():
        raise RuntimeError("relax.backends.megatron._cpu_compat.apply() is for CPU-only machines; CUDA is available")
    check_version()
    with _lock:
        if _applied:
            return
        torch.cuda.current_device = _cpu_current_device
        torch.cuda.synchronize = _cpu_synchronize
        _patch_checkpoint_rng()
        _applied = True


def _patch_checkpoint_rng() -> None:
    """Activation recomputation (``tensor_parallel.checkpoint``) saves and restores the CUDA RNG state
    around the recomputed forward; without CUDA there is none (and dropout is 0), so those two module
    functions save an empty state and restore nothing. The CPU RNG and the tracker are kept as is."""
    from megatron.core.tensor_parallel import random

    random._get_cuda_rng_state = lambda *args, **kwargs: torch.empty(0, dtype=torch.uint8)
    random._set_cuda_rng_state = lambda *args, **kwargs: None


def is_applied() -> bool:
    return _applied


def _is_cuda_device(device) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.split(":")[0] == "cuda"
    return False


class _CudaToCpuMode(TorchFunctionMode):
    """Rewrites CUDA placements to CPU inside Megatron code (see module docstring)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name = _CUDA_TYPE_NAMES.get(args[0].dtype)
            if name is not None:
                return name
        if _is_cuda_device(kwargs.get("device")):
            kwargs = {**kwargs, "device": "cpu"}
        return func(*args, **kwargs)


@contextlib.contextmanager
def cpu_device_scope():
    """Context in which Megatron's literal ``device="cuda"`` allocations land on CPU.

    A no-op unless :func:`apply` ran (so the same backend code runs unchanged on CUDA machines).
    """
    if not _applied:
        yield
        return
    with _CudaToCpuMode():
        yield
