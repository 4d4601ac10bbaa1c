"""The configuration rule of the evaluation flags (``--eval-*``, ``--no-eval``), one of the rules of
``relax.runtime.checks.validation`` (so ``relax train`` and ``run(config)`` refuse the same things, before
Ray starts). The evaluation itself is ``relax.runtime.driver.evaluation``.

Errors: a missing or unreadable ``--eval-prompt-data``, records without the evaluation keys (a value
out of range breaks its field's rule, which ``relax.runtime.checks.validation`` checks for every field). Warnings: an evaluation flag
that changes nothing (no evaluation set), several greedy samples per prompt (identical).
"""

from __future__ import annotations

import attrs

from relax.config.fields import flag_name
from relax.config.run import RunConfig

# How many records without a key a message lists.
LISTED = 5

_EVAL_FLAGS = ("eval_input_key", "eval_label_key", "eval_metadata_key", "eval_interval",
               "eval_n_samples_per_prompt", "eval_temperature", "eval_top_p", "eval_max_response_len",
               "eval_pass_threshold")


def _records(config, errors):
    """``--eval-prompt-data`` exists, reads, and every record has the evaluation keys (the full
    tokenization check is pre-flight's, ``relax.cli.preflight``, and the rollout worker's)."""
    from relax.rollout.prompt_files import read_rows

    path = config.eval_prompt_data
    try:
        rows, unit = read_rows(path, "--eval-prompt-data")
    except (OSError, ValueError, ImportError) as exc:
        errors.append(f"{exc.args[0] if exc.args else exc}")
        return
    if not rows:
        errors.append(f"--eval-prompt-data {path}: the file holds no prompts; give one JSON object per line")
        return
    label = config.eval_label_key if config.eval_label_key is not None else config.label_key
    metadata = config.eval_metadata_key if config.eval_metadata_key is not None else config.metadata_key
    wanted = [("--eval-input-key", config.eval_input_key or config.input_key, config.eval_input_key is None)]
    wanted += [("--eval-label-key", label, config.eval_label_key is None)] if label else []
    wanted += [("--eval-metadata-key", metadata, config.eval_metadata_key is None)] if metadata else []
    for flag, key, inherited in wanted:
        missing = [n for n, row in rows if not isinstance(row, dict) or key not in row]
        if missing:
            where = ", ".join(f"{unit} {n}" for n in missing[:LISTED]) + (" ..." if len(missing) > LISTED else "")
            origin = f" (default: {flag.replace('--eval-', '--')})" if inherited else ""
            first = next((row for _, row in rows if isinstance(row, dict)), {})
            errors.append(
                f"--eval-prompt-data {path}: {len(missing)} of {len(rows)} records have no {key!r} field, "
                f"which {flag}{origin} names ({where}); the records have {', '.join(map(repr, first)) or 'no fields'}: "
                f"pass {flag} FIELD"
            )


def check_evaluation(config: RunConfig, algorithm, who, errors, warnings):
    """The evaluation flags (see the module docstring)."""
    from relax.rollout.factory import evaluation_source

    if config.eval_prompt_data and config.evaluate:
        _records(config, errors)
    try:
        source = evaluation_source(config)
    except KeyError:  # an unknown --task is reported by the CLI; nothing to add here
        return
    if source is None:
        why = ("--no-eval" if not config.evaluate else
               "no evaluation set: give --eval-prompt-data (the built-in task's held-out problems are the "
               "default only without --prompt-data, --hf-checkpoint and --custom-rm-path)")
        defaults = RunConfig()
        changed = [name for name in _EVAL_FLAGS if getattr(config, name) != getattr(defaults, name)]
        changed += ["eval_prompt_data"] if config.eval_prompt_data else []
        fields = attrs.fields_dict(RunConfig)
        flags = [flag_name(fields[name]) for name in changed]
        flags += [flag_name(fields["eval_before_train"])] if not config.eval_before_train else []
        for flag in flags:
            warnings.append(f"{flag} has no effect: {why}")
        return
    if config.eval_n_samples_per_prompt > 1 and config.eval_temperature == 0:
        warnings.append(
            f"--eval-n-samples-per-prompt {config.eval_n_samples_per_prompt} with greedy decoding "
            "(--eval-temperature 0) gives identical samples, so pass@k = pass@1; set --eval-temperature, e.g. 1.0"
        )
    if source != "file":
        for name in ("eval_input_key", "eval_label_key", "eval_metadata_key"):
            if getattr(config, name) is not None:
                warnings.append(f"{flag_name(attrs.fields_dict(RunConfig)[name])} has no effect without --eval-prompt-data")
