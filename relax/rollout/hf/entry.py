"""``--rollout-engine hf`` in the engine registry (``relax.rollout.registry``): relax's KV-cached
transformers loop on ``--hf-checkpoint``, the default with one."""

from __future__ import annotations

from relax.rollout.registry import EngineEntry


class HFEntry(EngineEntry):
    title = "transformers"
    # float32 weights (its log-probs must match the trainer's): the weight route sends them as exported

    @classmethod
    def build(cls, config):
        from relax.rollout.hf.factory import hf_engine_from_config

        return hf_engine_from_config(config)
