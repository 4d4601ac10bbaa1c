"""What the worker roles share about the data plane: the fields of a sample's tokens, their
``TokenBatch``, moving what a read returns (CPU tensors) to a model's device, and attaching a worker
to the run's TransferQueue."""

from __future__ import annotations

import torch

from relax.models.batch import TokenBatch

BATCH_FIELDS = ("prompt_ids", "prompt_mask", "response_ids", "response_mask")
# Written only by multi-turn rollouts (--env-path): which response tokens are real (the
# environment's turns included); response_mask stays the loss mask (relax.models.batch).
ATTENTION_FIELD = "response_attention_mask"


def batch_fields(multi_turn: bool) -> tuple[str, ...]:
    """The fields of a sample's ``TokenBatch`` on the data plane."""
    return BATCH_FIELDS + ((ATTENTION_FIELD,) if multi_turn else ())


def token_batch(fields) -> TokenBatch:
    attended = fields.get(ATTENTION_FIELD)
    return TokenBatch(
        prompt_ids=fields["prompt_ids"].long(),
        prompt_mask=fields["prompt_mask"].bool(),
        response_ids=fields["response_ids"].long(),
        response_mask=fields["response_mask"].bool(),
        response_attention_mask=None if attended is None else attended.bool(),
    )


def to_device(fields, device: torch.device) -> dict:
    """``fields`` (a read's CPU tensors) with every tensor on ``device``, where the model computes. A
    role writes back to the data plane on the CPU (``.cpu()``)."""
    return {name: value.to(device, non_blocking=True) if isinstance(value, torch.Tensor) else value
            for name, value in fields.items()}


class AttachesDataPlane:
    """Mixin of the Ray workers: ``attach()`` connects ``self.data_plane`` to the run's TransferQueue
    (imported only there, so the plain cores run without it) and says on which node the worker runs."""

    def attach(self) -> str:
        """Connect to the data plane; returns the id of the Ray node this worker runs on."""
        import ray

        from relax.runtime.data.data_plane import TransferQueueDataPlane

        self.data_plane = TransferQueueDataPlane().attach()
        return ray.get_runtime_context().get_node_id()

    def device(self) -> str:
        """Where this worker's model is, in words (``relax.runtime.step.placement``)."""
        from relax.runtime.step.placement import describe, model_device

        return describe(model_device(self))
