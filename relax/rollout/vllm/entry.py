"""``--rollout-engine vllm`` in the engine registry (``relax.rollout.registry``): vLLM in the rollout
worker's process (the ``vllm`` extra). Importing this module imports neither vLLM nor transformers."""

from __future__ import annotations

from relax.rollout.registry import EngineEntry


class VLLMEntry(EngineEntry):
    title = "vLLM"
    sampling_fields = frozenset({"rollout_top_k", "rollout_min_p", "rollout_stop"})
    own_fields = frozenset({"rollout_gpu_memory_utilization"})
    # a separate implementation of the model: the trainer measures how far its log-probs are from its own
    reports_behaviour_log_probs = True
    runs_in_process = False  # not tried in the driver's process

    @classmethod
    def config_errors(cls, config) -> list[str]:
        """vLLM is installed and its model registry has the checkpoint's architecture."""
        from relax.rollout.vllm.factory import config_errors

        return config_errors(config)

    @classmethod
    def weights_dtype(cls, config) -> str | None:
        from relax.rollout.vllm import factory

        return factory.engine_dtype(config)  # looked up on the module: the factory's rule decides

    @classmethod
    def build(cls, config):
        from relax.rollout.vllm.factory import vllm_engine_from_config

        return vllm_engine_from_config(config)
