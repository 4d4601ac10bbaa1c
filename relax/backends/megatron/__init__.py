"""The Megatron training backend (optional extra: ``pip install 'relax-rl[megatron]'``).

Importing this package does not import megatron-core; ``load_megatron_backend()`` does, and turns a
missing install into an error that says which extra to install.
"""

from __future__ import annotations

import contextlib
import warnings

from relax.backends.megatron.rules import MegatronRules

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


class MegatronEntry(MegatronRules):
    """The registry's entry for ``--backend megatron``: the configuration check (``MegatronRules``),
    without megatron-core; ``load()`` imports ``MegatronBackend`` (``relax.backends.megatron.backend``),
    which derives from the same rules."""

    @classmethod
    def load(cls):
        return load_megatron_backend()
