"""The embedded default's KV-cached sampling engine (the model lives in ``relax.models.tiny``) and
the supervised warm-up that made the shipped checkpoint (``warmup.py``)."""

from relax.rollout.tiny.engine import TinyEngine

__all__ = ["TinyEngine"]
