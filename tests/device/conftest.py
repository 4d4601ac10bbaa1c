"""Fixtures of the device-emulation tests (``device_emulation.py``)."""

from __future__ import annotations

import pytest
from device_emulation import DEVICE, emulated_device


@pytest.fixture
def device(monkeypatch):
    """The emulated second device, active for the test; the model factory places models on it (as
    ``default_device()`` places them on a worker's GPU)."""
    import relax.models.factory as factory

    _let_kernels_accept_the_device(monkeypatch)
    with emulated_device() as dev:
        monkeypatch.setattr(factory, "default_device", lambda: dev)
        yield dev


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
