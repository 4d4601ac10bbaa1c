"""The vLLM rollout engine (``--rollout-engine vllm``, the ``vllm`` extra): ``VLLMEngine`` and its
factory. Importing this package does not import vLLM; building an engine does."""
