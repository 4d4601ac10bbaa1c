"""The vocabulary and checkpoint of the built-in ``calculator`` task (``relax.rollout.tasks.calculator``).

The addition task's 17 tokens keep their ids; four tags follow for the calculator tool::

    0..16 as in relax.models.tiny.tokenizer   17 <calc>   18 </calc>   19 <r>   20 </r>

``<calc>12+34</calc>`` is the model's call, ``<r>46</r>`` the environment's reply. The model is a
``TinyCausalLM`` with this vocabulary and 32 positions (an episode of two turns and the reply is at
most 26 tokens); its warm-up checkpoint is ``checkpoint/calculator.pt``
(``python -m relax.recipes.calculator_warmup`` makes it).
"""

from __future__ import annotations

from pathlib import Path

from relax.models.tiny.model import TinyCausalLM, TinyLMConfig
from relax.models.tiny.tokenizer import VOCAB as ADDITION_VOCAB
from relax.models.tiny.tokenizer import TinyTokenizer, token_pattern

CALL_OPEN, CALL_CLOSE, RESULT_OPEN, RESULT_CLOSE = "<calc>", "</calc>", "<r>", "</r>"
VOCAB: tuple[str, ...] = (*ADDITION_VOCAB, CALL_OPEN, CALL_CLOSE, RESULT_OPEN, RESULT_CLOSE)
MODEL_CONFIG = TinyLMConfig(vocab_size=len(VOCAB), max_seq_len=32)
CHECKPOINT = Path(__file__).parent / "checkpoint" / "calculator.pt"
# Built-in tasks whose tiny model is not the shipped addition warm-up (relax.models.factory).
TASK_CHECKPOINTS: dict[str, Path] = {"calculator": CHECKPOINT}


class CalculatorTokenizer(TinyTokenizer):
    vocab = VOCAB
    vocab_size = len(VOCAB)
    call_id, call_close_id = VOCAB.index(CALL_OPEN), VOCAB.index(CALL_CLOSE)
    result_id, result_close_id = VOCAB.index(RESULT_OPEN), VOCAB.index(RESULT_CLOSE)
    name = "calculator"
    token_re = token_pattern(VOCAB)


def load_calculator_model(path: str | Path | None = None) -> TinyCausalLM:
    from relax.models.tiny.weights import load_warmup_model

    return load_warmup_model(path if path is not None else CHECKPOINT)
