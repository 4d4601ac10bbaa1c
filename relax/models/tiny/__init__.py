"""The built-in model of the embedded default: a ~100k-parameter causal LM in plain torch, its
17-token tokenizer and the shipped warm-up checkpoint."""

from relax.models.tiny.model import KVCache, TinyCausalLM, TinyLMConfig
from relax.models.tiny.tokenizer import TinyTokenizer
from relax.models.tiny.weights import load_warmup_model

__all__ = ["KVCache", "TinyCausalLM", "TinyLMConfig", "TinyTokenizer", "load_warmup_model"]
