"""The owner of a kept cluster's TransferQueue.

TransferQueue's controller and storage unit belong to the process that called the first
``tq.init``: started by a run's driver, they end with it, and the next run on the same cluster pays
their start-up again (the largest part of it). On a cluster the run joined (``--ray-address``) the
data plane starts them inside this detached actor instead, so they stay up between runs; each run
then attaches, uses partitions under its own prefix (``RELAX_RUN_ID``) and clears them at its end.
"""

from __future__ import annotations

from relax.runtime.data.sampler import PromptGroupSampler

KEEPER_NAME, KEEPER_NAMESPACE = "relax_transferqueue", "relax"


class TransferQueueKeeper:
    """Made a detached Ray actor by ``TransferQueueDataPlane.start(keep=True)``."""

    def __init__(self):
        import transfer_queue as tq

        tq.init(tq_config())

    def ready(self) -> bool:
        return True


def tq_config() -> dict:
    """The TransferQueue configuration relax runs with (first ``tq.init`` only)."""
    return {
        "controller": {"sampler": PromptGroupSampler(), "polling_mode": True},
        "backend": {"storage_backend": "SimpleStorage", "SimpleStorage": {"num_data_storage_units": 1}},
    }
