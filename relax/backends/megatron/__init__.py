"""The Megatron training backend (optional extra: ``pip install 'relax-rl[megatron]'``).

Importing this package does not import megatron-core; ``load_megatron_backend()`` does, and turns a
missing install into an error that says which extra to install.
"""

from __future__ import annotations

INSTALL_HINT = (
    "--backend megatron needs megatron-core, which is not installed. Install the extra with "
    "`pip install 'relax-rl[megatron]'` (megatron-core==0.16.1; keep torch==2.13.0 pinned)."
)


class MegatronNotInstalled(ImportError):
    pass


def require_megatron() -> None:
    """Raise ``MegatronNotInstalled`` with the install hint if megatron-core cannot be imported."""
    try:
        import megatron.core  # noqa: F401
    except ImportError as exc:
        raise MegatronNotInstalled(f"{INSTALL_HINT} ({exc})") from exc


def load_megatron_backend():
    """The ``MegatronBackend`` class (imports megatron-core)."""
    require_megatron()
    from relax.backends.megatron.backend import MegatronBackend

    return MegatronBackend
