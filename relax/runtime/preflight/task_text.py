"""Pre-flight of a Hugging Face model on a built-in task's reward: can that reward score what the
model writes?

The built-in tasks for the tiny model (``--task addition`` and its variants) read a completion in the
tiny model's 17-token vocabulary (``relax.rollout.tasks.addition``: its ``length`` and ``format``
components count and match those tokens), so their reward raises on text outside it. A model of the
user's (``--hf-checkpoint``) writes from its own vocabulary; scored by such a reward (no
``--custom-rm-path``), the first completion holding, say, ``$`` would stop the run inside Ray. The
check calls the task's reward on the text of every token the model can sample, one token a
completion, and refuses the run on the first one it cannot score. A task whose reward reads any text
(``calculator``'s, a reasoning-gym task's) passes; so does a model whose vocabulary decodes only to
text the task knows.
"""

from __future__ import annotations

from relax.config.run import RunConfig
from relax.runtime.preflight.common import PreflightError, builtin_task, first_line

# Token ids decoded per batch_decode call (the scan stops at the first batch holding a failure).
DECODE_CHUNK = 4096


def _token_texts(tokenizer):
    """``(id, text)`` of every id of the model's tokenizer, decoded as the rollout decodes a completion
    (special tokens kept: ``relax.rollout.base.RolloutEngine.decode_responses``)."""
    hf = getattr(tokenizer, "hf", None)  # relax.models.hf.loading.HFTokenizer: batch_decode is ~10x faster
    for start in range(0, tokenizer.vocab_size, DECODE_CHUNK):
        ids = range(start, min(start + DECODE_CHUNK, tokenizer.vocab_size))
        texts = hf.batch_decode([[i] for i in ids]) if hf is not None else [tokenizer.decode([i]) for i in ids]
        yield from zip(ids, texts)


def check_task_reads_model_text(config: RunConfig, tokenizer, prompts: list) -> None:
    """With ``--hf-checkpoint`` and the built-in task's reward (no ``--custom-rm-path``; some reward key
    left to the function by the reward services): the reward scores the text of every model token."""
    if not config.hf_checkpoint or config.custom_rm_path or not prompts:
        return
    from relax.rollout.factory import function_reward_setup

    task = builtin_task(config)
    if task.needs_hf_checkpoint or not function_reward_setup(config)[1]:  # reads any text / is never called
        return
    _where, prompt = prompts[0]
    for token_id, text in _token_texts(tokenizer):
        try:
            task.reward_fn(prompt.text, text, prompt.label, dict(prompt.metadata))
        except Exception as exc:  # noqa: BLE001 - the reward's own failure, named below
            data = " scores the --prompt-data samples" if config.prompt_data else " scores every sample"
            raise PreflightError(
                f"--hf-checkpoint {config.hf_checkpoint} with --task {config.task}: the task's reward{data} "
                f"but reads only the built-in tiny model's vocabulary, and this model can write token "
                f"{token_id} {text!r}, which it cannot score ({first_line(exc)}). Give your own prompts and "
                "reward: --prompt-data FILE --custom-rm-path module:function, or a task written for Hugging "
                "Face models: --task reasoning-gym:<dataset> (the rewards extra)"
            ) from None
