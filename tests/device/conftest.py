"""Fixtures of the device-emulation tests (``device_emulation.py``)."""

from __future__ import annotations

import pytest
from device_emulation import DEVICE, emulated_device, on_the_cpu


@pytest.fixture
def device(monkeypatch):
    """The emulated second device, active for the test; the model factory places models on it (as
    ``default_device()`` places them on a worker's GPU)."""
    import relax.models.factory as factory

    _let_kernels_accept_the_device(monkeypatch)
    _load_hf_models_outside(monkeypatch)
    with emulated_device() as dev:
        monkeypatch.setattr(factory, "default_device", lambda: dev)
        yield dev


def _load_hf_models_outside(monkeypatch) -> None:
    """transformers builds a model on torch's own ``meta`` device and then fills it: under the emulation,
    whose device is ``meta`` too, that would give the model (and, through transformers' caches, every
    model loaded later in the process) unfilled buffers. Load on the CPU outside it, then move."""
    import relax.models.hf.loading as loading

    load = loading.load_hf_model

    def load_then_move(path, *, device="cpu", **kwargs):
        with on_the_cpu():
            model = load(path, device="cpu", **kwargs)
        return model.to(device)

    monkeypatch.setattr(loading, "load_hf_model", load_then_move)


def _let_kernels_accept_the_device(monkeypatch) -> None:
    """transformers' ``model.train()`` asks the ``kernels`` package (when installed) for the layers of
    the model's device type, which refuses ``meta``; it has no kernel for it and keeps the model's own
    layers, as it does for the CPU."""
    import importlib

    try:
        kernelize = importlib.import_module("kernels._internals.layer.kernelize")
    except ImportError:
        return
    validate = kernelize._validate_device_type
    monkeypatch.setattr(kernelize, "_validate_device_type",
                        lambda device_type: None if device_type == DEVICE.type else validate(device_type))
