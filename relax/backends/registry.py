"""The training backends, by ``--backend`` name.

Listed explicitly, like the algorithms. Each entry names the backend class and a light check of a
``RunConfig`` that needs none of the backend's heavy dependencies, so that ``relax train`` can refuse
a configuration before Ray starts and without importing megatron-core. Nothing outside
``relax/backends`` branches on a backend's name: the runtime asks the class
(``relax.backends.base.TrainingBackend``).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

# name -> (module with ``config_errors(config)``, how to load the class)
BACKENDS = {
    "torch": ("relax.backends.torch_backend", "relax.backends.torch_backend:TorchBackend"),
    "megatron": ("relax.backends.megatron", "relax.backends.megatron:load_megatron_backend"),
}


def backend_names() -> tuple[str, ...]:
    return tuple(BACKENDS)


def _entry(name: str) -> tuple[str, str]:
    try:
        return BACKENDS[name]
    except KeyError:
        raise ValueError(f"--backend {name!r}: unknown backend; choose one of {', '.join(BACKENDS)}") from None


def get_backend(name: str):
    """The ``TrainingBackend`` subclass for ``--backend name`` (a missing extra raises with its install hint)."""
    module, _, attr = _entry(name)[1].partition(":")
    found = getattr(importlib.import_module(module), attr)
    return found if isinstance(found, type) else found()  # a loader function imports lazily


def config_errors(config) -> list[str]:
    """Everything ``config`` asks of its ``--backend`` that the backend cannot do (empty: fine)."""
    return importlib.import_module(_entry(config.backend)[0]).config_errors(config)


def check_config(config) -> None:
    """``ValueError`` with every ``config_errors`` message (for ``run(config)`` called from Python)."""
    errors = config_errors(config)
    if errors:
        raise ValueError("; ".join(errors))


def get_critic_backend(name: str):
    """The backend that trains the critic of a ``--backend name`` run: that backend when it has a
    value head, else the torch backend (the critic is a single process: it needs no model parallelism)."""
    backend = get_backend(name)
    return backend if backend.supports_critic else get_backend("torch")


def checkpoint_backend(state: Mapping) -> str:
    """The ``--backend`` that wrote a run checkpoint. Checkpoints from before the ``backend`` key are
    recognized by their layout: only the Megatron backend's state carries a ``format`` tag."""
    if "backend" in state:
        return state["backend"]
    return "megatron" if "format" in state["actor"]["backend"] else "torch"
