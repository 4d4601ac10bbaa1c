"""TransferQueue's first ``tq.init`` with its controller and storage unit started at once.

``tq.init`` (TransferQueue 0.1.11) creates the controller, waits until its process is up (a new Python
process importing torch: seconds on a small machine), and only then creates the storage unit and
waits for it: two process start-ups in a row on the critical path of every run's start-up (the
workers wait for TransferQueue before they attach). The storage unit does not need the controller's
address, so ``start_transferqueue`` creates both and then waits for both: the same steps, the same
configuration and module state as ``tq.init`` (so ``tq.close`` and attaching clients work
unchanged), one start-up shorter. Should TransferQueue's internals differ from what this expects,
it calls ``tq.init`` itself.
"""

from __future__ import annotations


def start_transferqueue(conf: dict) -> None:
    """The first ``tq.init(conf)`` of a cluster, with its two actors starting in parallel."""
    import transfer_queue as tq

    try:
        from importlib import resources

        import ray
        from omegaconf import OmegaConf
        from transfer_queue import interface
        from transfer_queue.controller import TransferQueueController
        from transfer_queue.utils.zmq_utils import process_zmq_server_info

        steps = (interface._maybe_create_tq_storage, interface._maybe_create_tq_client)
    except (ImportError, AttributeError):
        tq.init(conf)
        return
    final = OmegaConf.merge(OmegaConf.create({}, flags={"allow_objects": True}),
                            OmegaConf.load(resources.files("transfer_queue") / "config.yaml"), conf)
    controller = TransferQueueController.options(name="TransferQueueController", namespace="transfer_queue").remote(
        sampler=final.controller.sampler, polling_mode=final.controller.polling_mode)
    interface._TQ_CONTROLLER = controller
    final = steps[0](final)  # creates the storage unit and waits for it while the controller starts
    final.controller.zmq_info = process_zmq_server_info(controller)
    ray.get(controller.store_config.remote(final))
    steps[1](final)
