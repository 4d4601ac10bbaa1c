"""Runnable recipes built from the same pieces as the runtime, without Ray: the single-process
training loop and the built-in tiny model's supervised warm-up."""
