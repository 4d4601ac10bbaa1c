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
  the Megatron calls that reach such sites (construction, the optimizer step, the DDP gradient
  reduction, the pipeline schedule), not around the model's forward and backward passes, which need
  only the process-wide patches above and would pay a Python call per tensor operation inside the
  mode; it is thread-local and scoped, so nothing else in the process sees it.

Two more patches are for speed, not correctness (``docs/en/megatron-on-cpu.md``, "Step time"); on
the benchmark model they take the Megatron optimizer step from ~3.0 to ~2.2 ms:

- without apex/Transformer Engine, Megatron's gradient norm and clipping use pure-Python fallbacks
  (``local_multi_tensor_l2_norm`` / ``local_multi_tensor_scale``: one ``torch.norm`` / multiply per
  tensor, each through the device scope). :func:`apply` swaps in ``torch._foreach_*`` versions that
  compute the same values bit for bit (same per-tensor kernels, same final reduction).
- the wrapped ``torch.optim`` optimizer needs no device rewrite, but inside the scope every one of
  its per-parameter operations pays a Python call: :func:`exempt_inner_optimizers` runs its
  ``step`` outside the scope.

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
        _patch_multi_tensor_fallbacks()
        _patch_plain_linear()
        _applied = True


def _patch_checkpoint_rng() -> None:
    """Activation recomputation (``tensor_parallel.checkpoint``) saves and restores the CUDA RNG state
    around the recomputed forward; without CUDA there is none (and dropout is 0), so those two module
    functions save an empty state and restore nothing. The CPU RNG and the tracker are kept as is."""
    from megatron.core.tensor_parallel import random

    random._get_cuda_rng_state = lambda *args, **kwargs: torch.empty(0, dtype=torch.uint8)
    random._set_cuda_rng_state = lambda *args, **kwargs: None


def _foreach_l2_norm(chunk_size, noop_flag, tensor_lists, per_tensor, *args):
    """``local_multi_tensor_l2_norm`` with ``torch._foreach_norm``: the norm of the per-tensor norms.

    ``_foreach_norm`` on CPU runs the same ``linalg_vector_norm`` kernel per tensor as the
    fallback's ``torch.norm``, and the final norm is over the same values in the same order, so the
    result is identical. Anything but float32 tensors (or a per-tensor request) goes to the original."""
    if per_tensor or any(t.dtype != torch.float32 for ts in tensor_lists for t in ts):
        return _ORIGINAL_FALLBACKS["l2"](chunk_size, noop_flag, tensor_lists, per_tensor, *args)
    norms = torch.stack([torch.stack(torch._foreach_norm(list(ts))) for ts in tensor_lists])
    return torch.norm(norms).reshape(1), None


def _foreach_scale(chunk_size, noop_flag, tensor_lists, scale):
    """``local_multi_tensor_scale`` (``dst = src * scale`` per tensor) with foreach kernels."""
    src, dst = list(tensor_lists[0]), list(tensor_lists[1])
    torch._foreach_copy_(dst, torch._foreach_mul(src, scale))


_ORIGINAL_FALLBACKS: dict = {}


def _patch_multi_tensor_fallbacks() -> None:
    """Replace megatron-core's pure-Python multi-tensor fallbacks where they are in use (they are
    when neither apex nor Transformer Engine is installed, always the case on CPU)."""
    from megatron.core import utils
    from megatron.core.optimizer import clip_grads, optimizer

    _ORIGINAL_FALLBACKS["l2"] = utils.local_multi_tensor_l2_norm
    if clip_grads.l2_norm_impl is utils.local_multi_tensor_l2_norm:
        clip_grads.l2_norm_impl = _foreach_l2_norm
    for module in (clip_grads, optimizer):
        if module.multi_tensor_scale_impl is utils.local_multi_tensor_scale:
            module.multi_tensor_scale_impl = _foreach_scale


def _plain_linear(input, weight, bias, gradient_accumulation_fusion, allreduce_dgrad, sequence_parallel,
                  grad_output_buffer=None, wgrad_deferral_limit=0, async_grad_allreduce=None, tp_group=None):
    """``linear_with_grad_accumulation_and_async_allreduce`` as ``F.linear`` when it has nothing to
    overlap: no gradient all-reduce or sequence-parallel gather, no fused accumulation, no deferred
    weight gradients (always so at TP 1, and for the row-parallel layers at any TP). The autograd
    function it replaces computes ``matmul`` then adds the bias in a separate pass and runs its
    backward in Python; ``F.linear`` is one fused ``addmm`` with torch's own backward."""
    if gradient_accumulation_fusion or allreduce_dgrad or async_grad_allreduce or sequence_parallel or (
        grad_output_buffer is not None
    ):
        return _ORIGINAL_FALLBACKS["linear"](
            input, weight, bias, gradient_accumulation_fusion, allreduce_dgrad, sequence_parallel,
            grad_output_buffer, wgrad_deferral_limit, async_grad_allreduce, tp_group,
        )
    return torch.nn.functional.linear(input, weight, bias)


def _patch_plain_linear() -> None:
    from megatron.core.tensor_parallel import layers

    original = layers.linear_with_grad_accumulation_and_async_allreduce
    _ORIGINAL_FALLBACKS["linear"] = original
    # The original reads and sets a ``warned`` attribute on whatever its module-level name points to.
    _plain_linear.warned = getattr(original, "warned", False)
    layers.linear_with_grad_accumulation_and_async_allreduce = _plain_linear


def exempt_inner_optimizers(megatron_optimizer) -> None:
    """Run the ``torch.optim`` optimizers inside ``megatron_optimizer`` outside :func:`cpu_device_scope`.

    Megatron's wrapper around them (gradient norm, clipping, mixed-precision copies) still runs in
    the scope; the wrapped optimizer itself allocates nothing on a device by name, and under the
    scope's ``TorchFunctionMode`` its ~10 operations per parameter each pay a Python call (measured:
    the Adam step of the benchmark model takes 1.6 ms in the scope, 0.8 ms outside). A no-op unless
    :func:`apply` ran."""
    if not _applied:
        return
    for inner in getattr(megatron_optimizer, "chained_optimizers", [megatron_optimizer]):
        torch_optimizer = getattr(inner, "optimizer", None)
        if torch_optimizer is None or getattr(torch_optimizer.step, "_relax_unscoped", False):
            continue
        torch_optimizer.step = _unscoped(torch_optimizer.step)


def _unscoped(fn):
    def run(*args, **kwargs):
        # The scope is the innermost function mode while Megatron calls the inner step; pop it for
        # the call only if so (torch.overrides' helper, stable since torch 2.0).
        if isinstance(torch.overrides._get_current_function_mode(), _CudaToCpuMode):
            with torch.overrides._pop_mode_temporarily():
                return fn(*args, **kwargs)
        return fn(*args, **kwargs)

    run._relax_unscoped = True
    return run


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
