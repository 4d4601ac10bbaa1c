"""``--rollout-engine tiny`` in the engine registry (``relax.rollout.registry``): the built-in
``--task``'s model in a ``TinyEngine``, the default without ``--hf-checkpoint``."""

from __future__ import annotations

from relax.rollout.registry import EngineEntry


class TinyEntry(EngineEntry):
    needs_hf_checkpoint = False  # samples from the built-in task's model
    # top-k and min-p filter its distribution (relax.models.sampled_distribution); it has no stop strings
    sampling_fields = frozenset({"rollout_top_k", "rollout_min_p"})

    @classmethod
    def build(cls, config):
        from relax.models.factory import default_device
        from relax.models.initial_weights import sft_tiny_model
        from relax.rollout.tasks import get_task

        engine = get_task(config.task).make_engine()
        start = sft_tiny_model(config.load)  # `relax train --load` of a `relax sft` checkpoint: its weights
        if start is not None:
            from relax.models.tiny.weights import load_warmup_model

            engine.load_weights(load_warmup_model(start).state_dict())
        return engine.to(default_device())  # the worker's GPU, if it has one
