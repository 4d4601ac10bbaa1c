"""Pre-flight of the prompts: every ``--prompt-data`` and ``--eval-prompt-data`` row read, validated
and tokenized as the rollout will, or the built-in task's first prompts tokenized."""

from __future__ import annotations

import logging
import warnings as warnings_module

from relax.config.run import RunConfig
from relax.runtime.preflight.common import PreflightError, builtin_task, first_line

# How many prompts the reward function is called on.
REWARD_SAMPLES = 4
# How many of the built-in task's prompts are tokenized.
TOKENIZE_SAMPLES = 4


def load_prompts(config: RunConfig, tokenizer, warnings: list[str] | None = None) -> list:
    """The first prompts of the run as ``(where, Prompt)``; every ``--prompt-data`` row is validated.
    Warnings (prompts dropped by --max-prompt-len) are appended to ``warnings``."""
    if config.prompt_data:
        from relax.rollout.data import prompt_dataset_from_config
        from relax.rollout.prompt_files import PromptDataError

        data_logger = logging.getLogger("relax.rollout.data")
        was_disabled, data_logger.disabled = data_logger.disabled, True  # its warnings are relayed once below
        try:
            with warnings_module.catch_warnings(record=True) as caught:
                warnings_module.simplefilter("always")
                dataset = prompt_dataset_from_config(config, tokenizer)
            if warnings is not None:
                warnings.extend(str(w.message) for w in caught)
        except PromptDataError as exc:
            raise PreflightError(str(exc)) from None
        except (OSError, ValueError, ImportError) as exc:
            raise PreflightError(first_line(exc)) from None
        finally:
            data_logger.disabled = was_disabled
        return [(f"--prompt-data {config.prompt_data} {dataset.unit} {n}", p)
                for n, p in zip(dataset.line_numbers, dataset.prompts)][:REWARD_SAMPLES]
    builtin_task(config)  # a clear message for an unknown --task
    from relax.rollout.factory import build_prompt_source

    try:  # the rollout's own prompt source (a task for HF models formats with the tokenizer)
        prompts = build_prompt_source(config, tokenizer).next_batch(TOKENIZE_SAMPLES)
    except (ValueError, ImportError) as exc:
        raise PreflightError(f"--task {config.task}: {first_line(exc)}") from None
    for i, prompt in enumerate(prompts):
        try:
            ids = tokenizer.encode(prompt.text)
        except Exception as exc:  # noqa: BLE001 - the tokenizer's failure, named
            raise PreflightError(
                f"--task {config.task}: the tokenizer cannot encode prompt {i} {prompt.text!r}: {first_line(exc)}"
            ) from None
        if len(ids) == 0:
            raise PreflightError(f"--task {config.task}: prompt {i} {prompt.text!r} has no tokens with this tokenizer")
    return [(f"--task {config.task} prompt {i}", p) for i, p in enumerate(prompts)][:REWARD_SAMPLES]


# How many evaluation prompts the reward function is also called on (they may hold other labels).
EVAL_REWARD_SAMPLES = 2


def check_eval_prompts(config: RunConfig, tokenizer, warnings: list[str] | None = None) -> list:
    """``--eval-prompt-data``: every record read, validated and tokenized as the rollout workers will.
    Returns its first prompts as ``(where, Prompt)``, for the reward function's pre-flight call."""
    if not (config.eval_prompt_data and config.evaluate):
        return []
    from relax.rollout.data import eval_dataset_from_config

    with warnings_module.catch_warnings(record=True) as caught:
        warnings_module.simplefilter("always")
        try:
            dataset = eval_dataset_from_config(config, tokenizer)
        except (OSError, ValueError, ImportError) as exc:  # PromptDataError is a ValueError: its whole text
            raise PreflightError(str(exc) if "bad " in str(exc) else first_line(exc)) from None
    if warnings is not None:
        warnings.extend(str(w.message) for w in caught)
    return [(f"--eval-prompt-data {config.eval_prompt_data} {dataset.unit} {n}", p)
            for n, p in zip(dataset.line_numbers, dataset.prompts)][:EVAL_REWARD_SAMPLES]
