"""Training backends: per-token log-probs and optimizer steps; the loss is always the algorithm's."""
