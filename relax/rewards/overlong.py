"""DAPO's soft over-long punishment as a reward component (arXiv:2503.14476, section 3.4).

With L the response length in tokens, L_max the expected maximum and L_cache the punishment
interval::

    R_length = 0                              if L <= L_max - L_cache
             = ((L_max - L_cache) - L) / L_cache  if L_max - L_cache < L <= L_max
             = -1                             if L > L_max

so the penalty grows linearly from 0 to -1 over the last L_cache tokens. Compose it with the task's
score and give it a weight::

    from relax.rewards import math, overlong, shaping

    reward = shaping.combine(math.score, overlong.soft_punishment(cache_length=512))

then ``--custom-rm-path my_module:reward --reward-keys correct has_answer overlong``. The length is
``metadata["response_tokens"]`` (the rollout counts the generated tokens of each sample); L_max
defaults to ``metadata["max_response_tokens"]``, the run's ``--rollout-max-response-len``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def punishment(length: int, max_length: int, cache_length: int) -> float:
    """The soft over-long punishment of a response of ``length`` tokens (the formula above)."""
    start = max_length - cache_length
    if length <= start:
        return 0.0
    if length <= max_length:
        return (start - length) / cache_length
    return -1.0


def soft_punishment(cache_length: int, max_length: int | None = None, *, key: str = "overlong"):
    """A reward function returning ``{key: punishment(response_tokens, L_max, cache_length)}``;
    ``max_length`` None: the run's generation limit (``metadata["max_response_tokens"]``)."""
    if isinstance(cache_length, bool) or not isinstance(cache_length, int) or cache_length < 1:
        raise ValueError(f"soft_punishment: cache_length must be an int >= 1, got {cache_length!r}")
    if max_length is not None and (not isinstance(max_length, int) or max_length < cache_length):
        raise ValueError(
            f"soft_punishment: max_length must be an int >= cache_length ({cache_length}), got {max_length!r}"
        )

    def reward(prompt: str, completion: str, label: Any, metadata: Mapping) -> dict[str, float]:
        if "response_tokens" not in metadata:
            raise KeyError(
                "soft_punishment needs metadata['response_tokens'] (the sample's generated token count), "
                "which the rollout adds; call it through the rollout, or pass that key yourself"
            )
        limit = max_length if max_length is not None else metadata["max_response_tokens"]
        if limit < cache_length:
            raise ValueError(
                f"soft_punishment: the generation limit {limit} (--rollout-max-response-len) is shorter than "
                f"cache_length {cache_length}; lower cache_length or raise the limit"
            )
        return {key: punishment(int(metadata["response_tokens"]), limit, cache_length)}

    return reward
