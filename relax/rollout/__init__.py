"""Generation engines, the built-in tiny causal LM and tokenizer, prompt sources, reward functions,
multi-turn environments (``Environment``, ``EnvStep``)."""

from relax.rollout.environments.base import Environment, EnvStep

__all__ = ["EnvStep", "Environment"]
