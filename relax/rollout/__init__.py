"""Generation engines, the built-in tiny causal LM and tokenizer, prompt sources, reward functions."""
