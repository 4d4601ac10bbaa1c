"""A second device on a CPU-only machine, for tests that must see device bugs without a GPU.

Tensors "on the device" are ``OnDevice`` wrappers: they report ``torch.device("meta")`` (the one
non-CPU device every torch build has, and one the autograd engine treats like the CPU, so backward
passes run) but hold real CPU data, so code runs to the end and a test can compare its numbers with
a CPU run (equal up to summation order: torch decomposes a few operations, such as attention and the
multi-tensor optimizer steps, differently for a wrapper tensor). While ``emulated_device()`` is active,
every torch operation is checked with CUDA's placement rules before it runs:

- an operation's tensors must share one device, except CPU zero-dimensional tensors (scalars), which
  CUDA kernels accept: else ``Expected all tensors to be on the same device ...``;
- ``index`` / ``index_put`` accept CPU indices into a device tensor, but not device indices into a
  CPU tensor: ``indices should be either on cpu or on the same device as the indexed tensor (cpu)``;
- copies (``.to``, ``copy_``; also ``aten.to`` itself, which inference mode leaves undecomposed) move
  data between the devices;
- a factory call with ``device=`` makes its tensor on that device.

These are the two errors a real H200 raised on code that mixed a CPU batch with a GPU model. Torch's
own ``meta`` tensors and ``FakeTensorMode`` with a fake ``cuda`` device raise the first one too, but
compute no values, so ``.item()``, ``.tolist()`` and data-dependent shapes (packing plans,
``nonzero``) stop them; the wrappers here run such code to the end.

Not emulated: bf16 autocast (``torch.autocast(device_type="meta")`` becomes the CPU's, which leaves
the wrappers' operations in their own dtype), and a device's own kernels or memory.
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

DEVICE = torch.device("meta")
_CPU = torch.device("cpu")
_COPIES = {"_to_copy", "copy_", "_copy_from", "_copy_from_and_resize", "lift_fresh", "lift_fresh_copy", "to"}
_INDEXING = {"index", "index_put", "index_put_", "_index_put_impl_", "_unsafe_index", "_unsafe_index_put"}


class OnDevice(torch.Tensor):
    """A tensor on the emulated device: CPU data behind a ``meta`` device tag."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, data: torch.Tensor):
        wrapper = torch.Tensor._make_wrapper_subclass(
            cls, data.shape, strides=data.stride(), storage_offset=data.storage_offset(), dtype=data.dtype,
            device=DEVICE, requires_grad=data.requires_grad)
        wrapper.cpu_data = data
        return wrapper

    def __repr__(self, *, tensor_contents=None):
        return f"OnDevice({self.cpu_data!r})"

    def tolist(self):  # a GPU tensor's .tolist() copies to the host
        return self.cpu_data.tolist()

    def numpy(self, *, force: bool = False):
        raise TypeError(f"can't convert {DEVICE} device type tensor to numpy. Use Tensor.cpu() to copy the tensor "
                        "to host memory first.")

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        with _CheckedMode():
            return func(*args, **(kwargs or {}))


def device_of(t: torch.Tensor) -> torch.device:
    return DEVICE if isinstance(t, OnDevice) else t.device


def cpu_data(t: torch.Tensor) -> torch.Tensor:
    """The CPU tensor behind ``t`` (``t`` itself when it is a CPU tensor)."""
    return t.cpu_data if isinstance(t, OnDevice) else t


def on_device(t: torch.Tensor) -> bool:
    return isinstance(t, OnDevice)


class _CheckedMode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        name = func.overloadpacket.__name__
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        if any(t.device.type == DEVICE.type and not on_device(t) for t in tensors):
            raise AssertionError(f"{func}: a real meta tensor (no data) reached the emulation; build it on the "
                                 "CPU and move it with .to()")
        if name not in _COPIES:
            _check_placement(name, args, tensors)
        target = kwargs.get("device")
        if name == "to" and len(args) > 1:
            # ``aten.to`` itself (under inference mode it reaches the mode undecomposed): ``to.device``
            # names the device positionally, ``to.other`` copies to another tensor's device and dtype
            if isinstance(args[1], torch.Tensor):
                target = device_of(args[1])
            elif isinstance(args[1], (torch.device, str)):
                target = torch.device(args[1])
                args = (args[0], _CPU if target.type == DEVICE.type else target, *args[2:])
        if target is not None:
            out_device = torch.device(target)
            if out_device.type == DEVICE.type and "device" in kwargs:
                kwargs["device"] = _CPU
        elif name in _COPIES:
            out_device = device_of(args[0])
        else:
            out_device = DEVICE if any(on_device(t) for t in tensors) else _CPU
        out = func(*tree_map(_unwrap, args), **tree_map(_unwrap, kwargs))
        if out_device.type != DEVICE.type:
            return out
        if _in_place(name) and args and on_device(args[0]):
            return args[0]  # in place: the caller's own tensor
        return tree_map(lambda t: OnDevice(t) if isinstance(t, torch.Tensor) and not on_device(t) else t, out)


def _in_place(name: str) -> bool:
    """``add_``, ``__iand__``: writes its first argument; ``__and__`` (a dunder) does not."""
    return name.endswith("_") and (not name.startswith("__") or name.startswith("__i"))


def _unwrap(t):
    return t.cpu_data if isinstance(t, OnDevice) else t


def _check_placement(name: str, args, tensors) -> None:
    devices = {device_of(t) for t in tensors}
    if len(devices) < 2:
        return
    if name in _INDEXING:
        base = device_of(args[0])
        indices = [t for t in tree_flatten(args[1])[0] if isinstance(t, torch.Tensor)]
        if any(device_of(t) not in (base, _CPU) for t in indices):
            raise RuntimeError(f"indices should be either on cpu or on the same device as the indexed tensor ({base})")
        tensors = [args[0]] + [t for t in tensors[1:] if all(t is not i for i in indices)]
    # CUDA kernels take CPU scalars (zero-dimensional tensors) beside device tensors
    placed = {device_of(t) for t in tensors if not (device_of(t) == _CPU and t.dim() == 0)}
    if len(placed) > 1:
        raise RuntimeError("Expected all tensors to be on the same device, but found at least two devices, "
                           f"{DEVICE} and cpu!")


# torch's own functions, which ``emulated_device()`` replaces and ``on_the_cpu()`` puts back
_REAL = {"autocast": torch.autocast, "tensor": torch.tensor, "as_tensor": torch.as_tensor}


def _autocast(device_type, *args, **kwargs):
    # torch has no autocast for ``meta``; the CPU's leaves the wrappers' operations as they are
    return _REAL["autocast"]("cpu" if device_type == DEVICE.type else device_type, *args, **kwargs)


def _from_data(name: str):
    # torch.tensor / torch.as_tensor build a ``meta`` tensor without dispatching any operation: build
    # it on the CPU, then move it (a checked copy)
    def build(data, *args, device=None, **kwargs):
        if device is not None and torch.device(device).type == DEVICE.type:
            return _REAL[name](data, *args, **kwargs).to(DEVICE)
        return _REAL[name](data, *args, device=device, **kwargs)

    return build


_EMULATED = {"autocast": _autocast, "tensor": _from_data("tensor"), "as_tensor": _from_data("as_tensor")}


@contextlib.contextmanager
def _torch_functions(functions: dict):
    saved = {name: getattr(torch, name) for name in functions}
    for name, fn in functions.items():
        setattr(torch, name, fn)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch, name, fn)


@contextlib.contextmanager
def emulated_device():
    """Within the block, ``DEVICE`` behaves as a second device (see the module docstring); yields it.

    Never load a transformers model inside it (wrap the load in ``on_the_cpu()``): transformers builds
    models on torch's own ``meta`` device and fills them afterwards, and it caches the replaced
    ``torch.tensor``, leaving this and every later model of the process with unfilled buffers."""
    with _torch_functions(_EMULATED), _CheckedMode():
        yield DEVICE


@contextlib.contextmanager
def on_the_cpu():
    """Within ``emulated_device()``, a block that runs plain CPU code outside the emulation (a reference
    run to compare with, a transformers load), relax's model factory placing models on the CPU."""
    from torch.utils._python_dispatch import _disable_current_modes

    import relax.models.factory as factory

    placed = factory.default_device
    factory.default_device = lambda: _CPU
    try:
        with _torch_functions(_REAL), _disable_current_modes():
            yield
    finally:
        factory.default_device = placed


def to_device(module: torch.nn.Module) -> torch.nn.Module:
    """``module`` with its parameters and buffers on the emulated device (inside ``emulated_device()``)."""
    return module.to(DEVICE)
