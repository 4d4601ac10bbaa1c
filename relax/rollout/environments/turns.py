"""How an environment's turn becomes tokens in the episode, and how long an episode may grow.

- A tokenizer with a chat template (a Hugging Face instruct model): the observation is a ``user``
  message, written exactly as the template writes one after an assistant message, followed by the
  template's generation prompt, so the model's next turn starts where it would in a chat. The
  wrapper strings are found once by rendering a two-message conversation with and without a third
  message.
- Any other tokenizer (the tiny model, base models): the observation's own tokens, no special tokens
  added.
"""

from __future__ import annotations

_MARK_USER, _MARK_ASSISTANT, _MARK_OBS = "relaxUSERmark", "relaxASSISTANTmark", "relaxOBSERVATIONmark"


def _chat_wrapper(hf) -> tuple[str, str, str] | None:
    """``(after_assistant, before, after)``: the template text around an observation, or None."""
    history = [{"role": "user", "content": _MARK_USER}, {"role": "assistant", "content": _MARK_ASSISTANT}]
    try:
        base = hf.apply_chat_template(history, tokenize=False)
        full = hf.apply_chat_template(history + [{"role": "user", "content": _MARK_OBS}], tokenize=False,
                                      add_generation_prompt=True)
    except Exception:  # noqa: BLE001 - a template that cannot render this: fall back to plain text
        return None
    if not full.startswith(base) or _MARK_OBS not in full:
        return None
    # What the template writes after the assistant's text; the model's own turn already ends with
    # its stop token (e.g. "<|im_end|>"), so only what follows that token is added.
    after_assistant = base[base.rindex(_MARK_ASSISTANT) + len(_MARK_ASSISTANT):]
    before, after = full[len(base):].split(_MARK_OBS, 1)
    return after_assistant, before, after


class TurnFormat:
    """``observation_ids(text, after_ids)``: the token ids of an environment turn."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        hf = getattr(tokenizer, "hf", None)
        self.hf = hf
        self.wrapper = _chat_wrapper(hf) if hf is not None and getattr(tokenizer, "has_chat_template", False) else None

    def observation_ids(self, text: str, previous_token: int | None) -> list[int]:
        if self.hf is None:
            return list(self.tokenizer.encode(text))
        if self.wrapper is not None:
            after_assistant, before, after = self.wrapper
            stop = self.hf.decode([previous_token]).strip() if previous_token is not None else ""
            trimmed = after_assistant.lstrip()
            closing = trimmed[len(stop):] if stop and trimmed.startswith(stop) else after_assistant
            text = closing + before + text + after
        return list(self.hf(text, add_special_tokens=False)["input_ids"])


def context_limit(engine) -> int | None:
    """The most positions the engine's model takes (prompt + every turn), when it says so."""
    config = getattr(getattr(engine, "model", None), "config", None)
    for name in ("max_seq_len", "max_position_embeddings"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None
