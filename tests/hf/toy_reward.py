"""A two-component reward for runs on a random byte-level model (``--custom-rm-path toy_reward:reward``).

Both components vary between samples of a random model, so every group carries signal and the
optimizer really steps: ``digits`` is the share of digit characters in the completion, ``stops`` is 1
when the completion ended with a stop token.
"""

from __future__ import annotations

REWARD_KEYS = ("digits", "stops")


def reward(prompt: str, completion: str, label, metadata) -> dict[str, float]:
    stops = completion.endswith(("<eos>", "<|im_end|>"))
    text = completion.removesuffix("<eos>").removesuffix("<|im_end|>")
    return {"digits": sum(c.isdigit() for c in text) / max(len(text), 1), "stops": float(stops)}
