"""The Megatron training backend (optional extra: ``pip install 'relax-rl[megatron]'``).

Importing this package does not import megatron-core; ``load_megatron_backend()`` does, and turns a
missing install into an error that says which extra to install.
"""

from __future__ import annotations

import contextlib
import importlib.util
import warnings
from pathlib import Path

from relax.backends.base import TrainingBackend

INSTALL_HINT = (
    "--backend megatron needs megatron-core, which is not installed. Install the extra with "
    "`pip install 'relax-rl[megatron]'` (megatron-core==0.16.1; keep torch==2.13.0 pinned)."
)


class MegatronNotInstalled(ImportError):
    pass


# megatron-core's notes, at import, that it falls back to torch without apex / Transformer Engine
# (always the case on CPU): news for whoever picks fused kernels, noise in every Megatron run's output.
CPU_FALLBACK_NOTES = ("Transformer Engine and Apex are not installed", "Apex is not installed",
                      "Transformer Engine is not installed")


@contextlib.contextmanager
def _without_fallback_notes():
    with warnings.catch_warnings():
        for note in CPU_FALLBACK_NOTES:
            warnings.filterwarnings("ignore", message=note)
        yield


def require_megatron() -> None:
    """Raise ``MegatronNotInstalled`` with the install hint if megatron-core cannot be imported."""
    try:
        with _without_fallback_notes():
            import megatron.core  # noqa: F401
    except ImportError as exc:
        raise MegatronNotInstalled(f"{INSTALL_HINT} ({exc})") from exc


def load_megatron_backend():
    """The ``MegatronBackend`` class (imports megatron-core)."""
    require_megatron()
    with _without_fallback_notes():
        from relax.backends.megatron.backend import MegatronBackend

    return MegatronBackend


def megatron_installed() -> bool:
    """Is megatron-core importable? Looks at the files only: importing it is slow and heavy."""
    spec = importlib.util.find_spec("megatron")
    if spec is None or not spec.submodule_search_locations:
        return False
    return any((Path(p) / "core" / "__init__.py").is_file() for p in spec.submodule_search_locations)


class MegatronEntry(TrainingBackend):
    """The registry's entry for ``--backend megatron``: the configuration check, without megatron-core.
    ``MegatronBackend`` (``relax.backends.megatron.backend``) derives from it; ``load()`` imports it."""

    name = "megatron"

    @classmethod
    def load(cls):
        return load_megatron_backend()

    @classmethod
    def config_errors(cls, config) -> list[str]:
        """What a ``RunConfig`` asks of ``--backend megatron`` that it cannot do (without importing it)."""
        from relax.backends import optim

        errors = optim.config_errors(config)
        if config.lora_rank:
            errors.append("--lora-rank is implemented for --backend torch only; drop it or use --backend torch")
        if not megatron_installed():
            errors.append(
                "--backend megatron needs megatron-core, which is not installed: pip install 'relax-rl[megatron]' "
                "(or use --backend torch)"
            )
        tp, pp = config.tensor_model_parallel_size, config.pipeline_model_parallel_size
        if config.hf_checkpoint:  # architecture and tp/pp layout, from config.json (no megatron import)
            from relax.backends.megatron.hf_convert import checkpoint_errors

            errors.extend(checkpoint_errors(config.hf_checkpoint, tp_size=tp, pp_size=pp))
        if config.actor_num_workers % (tp * pp):
            errors.append(
                f"--actor-num-workers {config.actor_num_workers} must be a multiple of "
                f"--tensor-model-parallel-size {tp} x --pipeline-model-parallel-size {pp} = {tp * pp}"
            )
        return errors
