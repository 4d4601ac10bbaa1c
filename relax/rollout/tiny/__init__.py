"""The embedded default: a ~100k-parameter causal LM in plain torch, its 17-token tokenizer, a
KV-cached sampling engine and the shipped warm-up checkpoint (see ``warmup.py``)."""

from relax.rollout.tiny.engine import TinyEngine
from relax.rollout.tiny.model import KVCache, TinyCausalLM, TinyLMConfig
from relax.rollout.tiny.tokenizer import TinyTokenizer

__all__ = ["KVCache", "TinyCausalLM", "TinyEngine", "TinyLMConfig", "TinyTokenizer"]
