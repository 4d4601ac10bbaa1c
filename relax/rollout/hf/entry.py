"""``--rollout-engine hf`` in the engine registry (``relax.rollout.registry``): relax's KV-cached
transformers loop on ``--hf-checkpoint``, the default with one."""

from __future__ import annotations

from relax.rollout.registry import EngineEntry


class HFEntry(EngineEntry):
    title = "transformers"

    @classmethod
    def weights_dtype(cls, config) -> str | None:
        """The engine's dtype (``relax.rollout.hf.precision``) on the asking process's device. The weight
        route asks in the actor rank that publishes, whose device stands for the engine's: relax gives
        an actor rank and a rollout worker a GPU alike (or neither), and ``--in-process`` holds both."""
        from relax.models import factory
        from relax.rollout.hf.precision import engine_dtype

        return str(engine_dtype(config, factory.default_device())).removeprefix("torch.")

    @classmethod
    def build(cls, config):
        from relax.rollout.hf.factory import hf_engine_from_config

        return hf_engine_from_config(config)
