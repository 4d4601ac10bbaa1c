"""Process environment for Ray and TransferQueue on small machines (docs/en/ray-and-transferqueue.md,
"Environment"). Imports nothing heavy, so it can be applied before Ray or TransferQueue start."""

from __future__ import annotations

import os

RAY_ENV_DEFAULTS = {
    "RAY_AUTH_MODE": "disabled",  # no token file in ~/.ray, no warning
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # bind Ray, Serve and TQ to 127.0.0.1 on a laptop
    "TQ_NUM_THREADS": "2",  # TransferQueue's default (8) logs a warning on every put/get on small machines
    "OMP_NUM_THREADS": "1",
    "RAY_DEDUP_LOGS": "0",
}


def apply_environment_defaults() -> None:
    """Set each default the user has not set. Must run before transfer_queue is imported (it reads
    TQ_NUM_THREADS once, at import: set later, its storage unit logged a warning on every put/get)
    and before Ray starts (``relax.runtime.data.sampler`` and ``ray_session.start_ray`` call it)."""
    for key, value in RAY_ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
