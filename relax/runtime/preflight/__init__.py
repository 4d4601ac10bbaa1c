"""Pre-flight: everything that can be checked before Ray or any worker starts, for ``relax train``
(also in ``--dry-run``) and for ``relax.runtime.driver.train.run(config)`` alike.

``validation.py`` checks the configuration against the method's capabilities; this module checks the
things the configuration points at, by reusing the code the workers will run:

- the method: ``cls(AlgorithmConfig)`` is built once, as every worker will build it;
- ``--output-dir``: not a file, writable, not locked by a running run, not another run's directory
  unless ``--load`` resumes it or ``--overwrite-output-dir`` replaces it (``relax.runtime.files.run_dir``);
- ``--load``: a readable, complete checkpoint that this run can continue
  (``relax.runtime.files.checkpoint_files.read_checkpoint`` / ``check_checkpoint``);
- ``--hf-checkpoint`` / ``--ref-load``: a Hugging Face directory with ``config.json`` transformers can
  read and weight files; the tokenizer (and chat template) loads;
- ``--prompt-data`` and ``--eval-prompt-data``: every row is read, validated and tokenized (``relax.rollout.data.PromptDataset``:
  file and line numbers, UTF-8, Parquet integrity);
- the reward function (``--custom-rm-path`` or the task's) is called on a few real prompts and its
  values go through the run's own checks (``relax.rollout.rewards.reward_matrix``); with
  ``--hf-checkpoint`` a built-in task's reward is also called on the text of every token the model can
  write (a task for the tiny model reads only its 17-token vocabulary: ``task_text``);
- ``--reward-model-path`` / ``--judge-model-path`` / ``--judge-template``: checkpoints of the right kind
  and a template with its placeholders (``reward_services``);
- ``--teacher-checkpoint``: a teacher the run can load, whose tokenizer is the student's (``teacher``);
- ``--ray-address``: something answers at that address.

Each problem raises ``PreflightError`` (a ``ConfigError``) with one message naming the flag, file, line,
sample or key. Nothing is created or written here. ``relax train`` runs it before it locks the output
directory; ``run(config)`` runs it again only for a configuration this process has not checked
(``preflight_once``), so a command line is checked once.

One module per kind of check: ``user_code`` (the method's constructor, reward hooks), ``outputs``
(output directory, ``--load``), ``model`` (checkpoint directory, tokenizer), ``prompts``, ``rewards``
(reward function, environment), ``task_text``, ``reward_services``, ``teacher`` and ``ray_address``; ``common`` holds ``PreflightError``.
"""

from __future__ import annotations

from relax.config.run import RunConfig
from relax.runtime.preflight.common import PreflightError
from relax.runtime.preflight.model import check_hf_dir, check_model, load_tokenizer
from relax.runtime.preflight.outputs import check_load, check_output, check_resume_metrics, check_trackers
from relax.runtime.preflight.prompts import check_eval_prompts, load_prompts
from relax.runtime.preflight.ray_address import check_ray
from relax.runtime.preflight.reward_services import check_reward_services
from relax.runtime.preflight.rewards import check_env, check_reward, is_multi_turn
from relax.runtime.preflight.task_text import check_task_reads_model_text
from relax.runtime.preflight.teacher import check_teacher
from relax.runtime.preflight.user_code import check_algorithm, check_hooks


def preflight(config: RunConfig, algorithm) -> list[str]:
    """Run every check; the first problem raises ``PreflightError``. Returns the warnings. Creates and
    writes nothing."""
    warnings: list[str] = []
    check_algorithm(config, algorithm)
    check_output(config)
    check_trackers(config)
    check_load(config, algorithm)
    check_resume_metrics(config, warnings)
    for path, flag in ((config.hf_checkpoint, "--hf-checkpoint"), (config.ref_load, "--ref-load")):
        if path and (flag == "--hf-checkpoint" or config.hf_checkpoint):
            check_hf_dir(path, flag)
    tokenizer = load_tokenizer(config)
    check_model(config, tokenizer)
    check_teacher(config, tokenizer)  # the teacher role: loadable, with the student's tokenizer
    prompts = load_prompts(config, tokenizer, warnings)
    prompts = prompts + check_eval_prompts(config, tokenizer, warnings)  # the reward scores both
    if is_multi_turn(config):  # the environment's rewards score the episodes: reset + one step
        check_env(config, prompts)
    else:
        check_reward(config, prompts)
        check_task_reads_model_text(config, tokenizer, prompts)  # --hf-checkpoint on a tiny-vocabulary task
    check_reward_services(config)
    check_hooks(config)
    check_ray(config)
    _remember(config)
    return warnings


# The configurations that passed pre-flight in this process (``relax train`` checks before ``run``).
_PASSED: set = set()


def _remember(config: RunConfig) -> None:
    try:
        _PASSED.add(config)
    except TypeError:  # an unhashable field value: run() checks it again
        pass


def was_checked(config: RunConfig) -> bool:
    """Whether an equal configuration passed pre-flight in this process (``relax train`` printed its
    warnings then)."""
    try:
        return config in _PASSED
    except TypeError:
        return False


def preflight_once(config: RunConfig, algorithm) -> list[str]:
    """``preflight``, unless this process already checked an equal configuration (then no warnings)."""
    return [] if was_checked(config) else preflight(config, algorithm)


__all__ = ["PreflightError", "preflight", "preflight_once", "was_checked"]
