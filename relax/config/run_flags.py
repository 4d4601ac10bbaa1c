"""Pieces of ``RunConfig``'s flag declarations kept out of its field list (``relax.config.run``): the
fixed choices of two flags, each implemented in a layer above that imports its list from here, and the
flag of a user-code hook."""

from __future__ import annotations

from relax.config.fields import flag

LR_DECAY_STYLES = ("constant", "linear", "cosine")  # relax.backends.optim implements each
SHARDING_MODES = ("none", "fsdp")  # relax.backends.sharding implements fsdp
WEIGHT_TRANSPORTS = ("object-store", "collective")  # relax.runtime.weights.weight_sync.TRANSPORTS


def hook_flag(help: str) -> dict:
    """The flag of a ``--*-path`` hook: your ``module:function``, in the rewards group."""
    return flag(help, group="rewards", metavar="MODULE:FUNCTION")
