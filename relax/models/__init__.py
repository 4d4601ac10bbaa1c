"""Models and shared types, below both the rollout engines and the training backends.

``batch`` (``TokenBatch``, log-probs from logits), ``sampled_distribution`` (the sampling's
truncation, replayed by the engines and the trainer alike), ``tiny`` (the built-in model, tokenizer and
warm-up checkpoint), ``hf`` (Hugging Face loading and export), ``value`` (critics: a scalar head on
a policy's trunk) and ``factory`` (the trainer's models for a ``RunConfig``).
"""
