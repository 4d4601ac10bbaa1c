"""relax: reinforcement-learning post-training of language models. One RL method = one class."""

__version__ = "0.1.0"
