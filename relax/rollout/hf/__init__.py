"""Generation with Hugging Face causal LMs: the KV-cached ``HFEngine`` with sampling log-probs.

The models themselves (loading, tokenizer, export) live in ``relax.models.hf``.
"""

from relax.rollout.hf.engine import HFEngine, top_p_filter
from relax.rollout.hf.factory import hf_engine_from_config

__all__ = ["HFEngine", "hf_engine_from_config", "top_p_filter"]
