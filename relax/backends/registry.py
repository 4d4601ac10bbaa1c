"""The training backends, by ``--backend`` name.

Listed explicitly, like the algorithms. Each entry names the backend class and a light check of a
``RunConfig`` that needs none of the backend's heavy dependencies, so that ``relax train`` can refuse
a configuration before Ray starts and without importing megatron-core. Nothing outside
``relax/backends`` branches on a backend's name: the runtime asks the class
(``relax.backends.base.TrainingBackend``).
"""

from __future__ import annotations

from collections.abc import Mapping

from relax.importing import load_attribute

# name -> the backend's entry class. An entry answers the light questions (``config_errors``) without
# the backend's heavy dependencies; ``load()`` returns the class that trains (the entry itself for
# torch; for Megatron a shim whose ``load`` imports megatron-core).
BACKENDS = {
    "torch": "relax.backends.torch_backend:TorchBackend",
    "megatron": "relax.backends.megatron:MegatronEntry",
}


def backend_names() -> tuple[str, ...]:
    return tuple(BACKENDS)


def backend_entry(name: str):
    """The entry class of ``--backend name`` (light: imports no heavy dependency)."""
    try:
        spec = BACKENDS[name]
    except KeyError:
        raise ValueError(f"--backend {name!r}: unknown backend; choose one of {', '.join(BACKENDS)}") from None
    return load_attribute(spec, "--backend")


def get_backend(name: str):
    """The ``TrainingBackend`` subclass for ``--backend name`` (a missing extra raises with its install hint)."""
    return backend_entry(name).load()


def config_errors(config) -> list[str]:
    """Everything ``config`` asks of its ``--backend`` that the backend cannot do (empty: fine)."""
    entry = backend_entry(config.backend)
    errors = entry.config_errors(config)
    if config.max_tokens_per_micro_batch is not None and not entry.packs_micro_batches:
        errors.append(f"--max-tokens-per-micro-batch is implemented for --backend torch only; drop it "
                      f"(--micro-batch-size sizes the {config.backend} backend's micro-batches) or use --backend torch")
    if config.sharding not in entry.sharding_modes:
        errors.append(f"--sharding {config.sharding} is implemented for --backend torch only; drop it (the "
                      f"{config.backend} backend shards with its own parallelism flags) or use --backend torch")
    return errors


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
