"""Pre-flight: everything that can be checked before Ray or any worker starts, for ``relax train``
(also in ``--dry-run``) and for ``relax.runtime.train.run(config)`` alike.

``validation.py`` checks the configuration against the method's capabilities; this module checks the
things the configuration points at, by reusing the code the workers will run:

- the method: ``cls(AlgorithmConfig)`` is built once, as every worker will build it;
- ``--output-dir``: not a file, writable, not locked by a running run, not another run's directory
  unless ``--load`` resumes it or ``--overwrite-output-dir`` replaces it (``relax.runtime.run_dir``);
- ``--load``: a readable, complete checkpoint that this run can continue
  (``relax.runtime.checkpoints.read_checkpoint`` / ``check_checkpoint``);
- ``--hf-checkpoint`` / ``--ref-load``: a Hugging Face directory with ``config.json`` transformers can
  read and weight files; the tokenizer (and chat template) loads;
- ``--prompt-data`` and ``--eval-prompt-data``: every row is read, validated and tokenized (``relax.rollout.data.PromptDataset``:
  file and line numbers, UTF-8, Parquet integrity);
- the reward function (``--custom-rm-path`` or the task's) is called on a few real prompts and its
  values go through the run's own checks (``relax.rollout.rewards.reward_matrix``);
- ``--ray-address``: something answers at that address.

Each problem raises ``PreflightError`` (a ``ConfigError``) with one message naming the flag, file, line,
sample or key. Nothing is created or written here. ``relax train`` runs it before it locks the output
directory; ``run(config)`` runs it again only for a configuration this process has not checked
(``preflight_once``), so a command line is checked once.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import threading
import warnings as warnings_module

from relax.config.run import RunConfig
from relax.runtime.validation import ConfigError

# How many prompts the reward function is called on, and how long pre-flight waits for those calls.
REWARD_SAMPLES = 4
REWARD_PREFLIGHT_TIMEOUT_S = 60.0
# How many of the built-in task's prompts are tokenized.
TOKENIZE_SAMPLES = 4

WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin", "*.safetensors.index.json", "pytorch_model.bin.index.json")


class PreflightError(ConfigError):
    """A problem found before any process starts (``relax train`` exits with status 2)."""

    def __init__(self, message: str):
        super().__init__([message])

    def __reduce__(self):
        return (type(self), (self.errors[0],))


def _first_line(exc: BaseException) -> str:
    text = str(exc.args[0]) if len(exc.args) == 1 and isinstance(exc.args[0], str) else str(exc)
    return text.strip() or type(exc).__name__


def _task(config: RunConfig):
    """The built-in ``--task`` (used for the tokenizer, prompts or reward the run does not get elsewhere)."""
    from relax.rollout.tasks import get_task

    try:
        return get_task(config.task)
    except KeyError as exc:
        raise PreflightError(_first_line(exc)) from None


# -- the method -------------------------------------------------------------------------------------


def check_algorithm(config: RunConfig, algorithm) -> None:
    """Every process builds ``algorithm(config.algorithm)``; a constructor that raises fails here once."""
    try:
        algorithm(config.algorithm)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - a user's constructor: report whatever it raised
        raise PreflightError(
            f"--advantage-estimator {config.advantage_estimator}: {algorithm.__name__}(config) raised "
            f"{type(exc).__name__}: {_first_line(exc).splitlines()[0]}"
        ) from None


# -- output directory and checkpoint --------------------------------------------------------------


def check_output(config: RunConfig) -> None:
    from relax.config.run import output_dir_of
    from relax.runtime.run_dir import RunDirError, check_output_dir

    try:
        check_output_dir(output_dir_of(config), resuming=config.load or False, overwrite=config.overwrite_output_dir)
    except RunDirError as exc:
        raise PreflightError(str(exc)) from None


def check_load(config: RunConfig, algorithm) -> None:
    if not config.load:
        return
    from relax.runtime import roles as R
    from relax.runtime.checkpoints import CheckpointError, check_checkpoint, read_checkpoint

    try:
        _, state = read_checkpoint(config.load)
        layout = R.derive_roles(algorithm, config)
        check_checkpoint(config, state, config.load, has_critic=R.CRITIC in layout)
    except (CheckpointError, KeyError, TypeError) as exc:
        if isinstance(exc, CheckpointError):
            raise PreflightError(str(exc)) from None
        raise PreflightError(
            f"--load {config.load}: the checkpoint does not have the layout this relax writes "
            f"({type(exc).__name__}: {_first_line(exc)}); load a checkpoint written by this version of relax"
        ) from None


def check_resume_metrics(config: RunConfig, warnings: list[str]) -> None:
    """``--load`` of a run directory: its ``metrics.jsonl`` is read as the resumed run will read it (a
    partial last line is dropped with a warning; other damage names the file and the line)."""
    if not config.load:
        return
    from relax.runtime.metrics import MetricsFileError, read_metrics
    from relax.runtime.run_dir import run_of_checkpoint

    owner = run_of_checkpoint(config.load)
    if owner is None or not (owner / "metrics.jsonl").is_file():
        return
    try:
        _, warning = read_metrics(owner / "metrics.jsonl")
    except (MetricsFileError, OSError) as exc:
        raise PreflightError(f"--load {config.load}: {_first_line(exc)}") from None
    if warning:
        warnings.append(f"--load {config.load}: {warning}")


# -- model and tokenizer ---------------------------------------------------------------------------


def check_hf_dir(path: str, flag: str) -> None:
    """A local Hugging Face directory: ``config.json`` that transformers reads, and weight files."""
    from relax.models.hf.loading import check_checkpoint_dir

    try:
        p = check_checkpoint_dir(path, flag=flag)
    except (OSError, ValueError) as exc:
        raise PreflightError(_first_line(exc)) from None
    try:
        json.loads((p / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PreflightError(
            f"{flag} {path}: config.json is not valid JSON ({_first_line(exc)}); restore it from the model's source"
        ) from None
    if not any(next(p.glob(pattern), None) for pattern in WEIGHT_PATTERNS):
        raise PreflightError(
            f"{flag} {path}: no model weights (*.safetensors or pytorch_model*.bin) in the directory; copy "
            "the complete checkpoint (save_pretrained writes them next to config.json)"
        )
    try:
        import transformers

        with _quiet():
            transformers.AutoConfig.from_pretrained(str(p), local_files_only=True)
    except ImportError:
        raise PreflightError(f"{flag} needs the 'transformers' package: pip install 'relax-rl[hf]'") from None
    except Exception as exc:  # noqa: BLE001 - unknown model_type, bad field: transformers' words, one line
        raise PreflightError(
            f"{flag} {path}: transformers cannot read its config.json ({_first_line(exc).splitlines()[0]})"
        ) from None


@contextlib.contextmanager
def _quiet():
    """Silence transformers' progress bars and warnings while pre-flight loads things."""
    with contextlib.redirect_stderr(io.StringIO()):
        yield


def load_tokenizer(config: RunConfig):
    """The tokenizer the rollout will use: the HF checkpoint's or the built-in task's."""
    if config.hf_checkpoint:
        from relax.models.hf.loading import load_hf_tokenizer

        try:
            with _quiet():
                return load_hf_tokenizer(config.hf_checkpoint)
        except Exception as exc:  # noqa: BLE001 - any failure to load the tokenizer, in one line
            message = _first_line(exc).splitlines()[0].rstrip(": ")
            if not message.startswith("--hf-checkpoint"):
                message = f"--hf-checkpoint {config.hf_checkpoint}: cannot load the tokenizer ({type(exc).__name__}: {message})"
            raise PreflightError(
                f"{message}; the directory needs the tokenizer files save_pretrained writes (tokenizer.json or "
                "tokenizer.model / vocab files, and tokenizer_config.json)"
            ) from None
    return _task(config).make_tokenizer()


def check_model(config: RunConfig, tokenizer) -> None:
    """``--hf-checkpoint``: a causal LM whose vocabulary covers the tokenizer, whose weight files are
    whole and match ``config.json``, with the ``--lora-target-modules`` it names
    (``relax.models.hf.checks``)."""
    if not config.hf_checkpoint:
        return
    from relax.models.hf.checks import check_hf_model

    with _quiet():
        problem = check_hf_model(config, tokenizer)
    if problem:
        raise PreflightError(problem)


# -- prompts ---------------------------------------------------------------------------------------


def load_prompts(config: RunConfig, tokenizer, warnings: list[str] | None = None) -> list:
    """The first prompts of the run as ``(where, Prompt)``; every ``--prompt-data`` row is validated.
    Warnings (prompts dropped by --max-prompt-len) are appended to ``warnings``."""
    if config.prompt_data:
        from relax.rollout.data import PromptDataError, prompt_dataset_from_config

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
            raise PreflightError(_first_line(exc)) from None
        finally:
            data_logger.disabled = was_disabled
        return [(f"--prompt-data {config.prompt_data} {dataset.unit} {n}", p)
                for n, p in zip(dataset.line_numbers, dataset.prompts)][:REWARD_SAMPLES]
    _task(config)  # a clear message for an unknown --task
    from relax.rollout.factory import build_prompt_source

    try:  # the rollout's own prompt source (a task for HF models formats with the tokenizer)
        prompts = build_prompt_source(config, tokenizer).next_batch(TOKENIZE_SAMPLES)
    except (ValueError, ImportError) as exc:
        raise PreflightError(f"--task {config.task}: {_first_line(exc)}") from None
    for i, prompt in enumerate(prompts):
        try:
            ids = tokenizer.encode(prompt.text)
        except Exception as exc:  # noqa: BLE001 - the tokenizer's failure, named
            raise PreflightError(
                f"--task {config.task}: the tokenizer cannot encode prompt {i} {prompt.text!r}: {_first_line(exc)}"
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
            raise PreflightError(str(exc) if "bad " in str(exc) else _first_line(exc)) from None
    if warnings is not None:
        warnings.extend(str(w.message) for w in caught)
    return [(f"--eval-prompt-data {config.eval_prompt_data} {dataset.unit} {n}", p)
            for n, p in zip(dataset.line_numbers, dataset.prompts)][:EVAL_REWARD_SAMPLES]


# -- reward function -------------------------------------------------------------------------------


def _call_with_timeout(fn, timeout: float):
    box: dict = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="relax-preflight-reward", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        return False, None
    if "error" in box:
        error = box["error"]
        if not isinstance(error, (Exception, KeyboardInterrupt)):  # SystemExit from user code: a failure
            raise RuntimeError(f"raised {type(error).__name__}: {error}") from error
        raise error
    return True, box.get("value")


def check_reward(config: RunConfig, prompts: list) -> None:
    """Call the reward function on ``prompts`` (with an empty completion and the label as completion)
    and check the values exactly as the rollout will."""
    from relax.rollout.factory import reward_setup
    from relax.rollout.rewards import RewardError, call_reward_function, function_name, reward_matrix

    if not config.custom_rm_path:
        _task(config)  # a clear message for an unknown --task before reward_setup looks it up
    fn, keys = reward_setup(config)
    name = function_name(fn)
    flag = f"--custom-rm-path {config.custom_rm_path}" if config.custom_rm_path else f"--task {config.task}"
    if not config.custom_rm_path:
        produced = _task(config).reward_keys
        missing = [k for k in keys if k not in produced]
        if missing:
            data = " (--prompt-data without --custom-rm-path)" if config.prompt_data else ""
            raise PreflightError(
                f"--reward-keys {' '.join(keys)}: the built-in task {config.task!r} scores every sample{data} "
                f"and produces only {', '.join(produced)}, never {', '.join(map(repr, missing))}; pass your "
                f"reward function with --custom-rm-path module:function, or --reward-keys {' '.join(produced)}"
            )
    samples = []  # (description, prompt, completion, label, metadata)
    for where, prompt in prompts:
        completions = ["", str(prompt.label)] if prompt.label is not None else [""]
        for j, completion in enumerate(completions):
            # the rollout's length keys too (relax.rollout.sampling); a pre-flight completion is not
            # generated, so the two samples take the two ends of the range: 0 tokens and the limit
            max_tokens = config.rollout_max_response_len
            samples.append((f"{where}, completion {completion!r}", prompt.text, completion, prompt.label,
                            {**prompt.metadata, "sample_index": j, "response_tokens": max_tokens if j else 0,
                             "max_response_tokens": max_tokens}))
    if not samples:
        return
    # --reward-timeout bounds each call (a RewardError naming the sample); pre-flight waits for all of them
    limit = max(REWARD_PREFLIGHT_TIMEOUT_S, (config.reward_timeout or 0) * len(samples))
    try:
        done, values = _call_with_timeout(
            lambda: call_reward_function(fn, *(list(col) for col in zip(*(s[1:] for s in samples))),
                                         concurrency=config.reward_concurrency),  # called as the rollout calls it
            limit,
        )
    except RuntimeError as exc:  # a BaseException that is not an Exception (SystemExit), from _call_with_timeout
        if isinstance(exc, RewardError) or not str(exc).startswith("raised "):
            raise
        raise PreflightError(f"{flag}: pre-flight call on {samples[0][0]}, ...: reward function {name} {exc}") from None
    except RewardError as exc:
        raise PreflightError(
            f"{flag}: pre-flight call on {_sample_of(exc, samples)}: {_message(exc)}; it must return a value for "
            "every completion the model may produce, including an empty or malformed one"
        ) from None
    if not done:
        raise PreflightError(
            f"{flag}: reward function {name} did not return within {limit:.0f}s on "
            f"{len(samples)} pre-flight samples ({samples[0][0]}, ...); make it return (or time out) on its own"
        )
    try:
        reward_matrix(values, keys, name)
    except RewardError as exc:
        raise PreflightError(f"{flag}: pre-flight call on {_sample_of(exc, samples)}: {_message(exc)}") from None


def _message(exc: BaseException) -> str:
    """A RewardError's message without its ``sample i:`` prefix (pre-flight names the sample itself)."""
    import re

    return re.sub(r"^sample \d+: ", "", _first_line(exc))


def _sample_of(exc: BaseException, samples: list) -> str:
    """``sample i`` in a RewardError message -> the prompt's file/line (or task index) and completion."""
    import re

    match = re.match(r"sample (\d+):", str(exc))
    if match and int(match.group(1)) < len(samples):
        return samples[int(match.group(1))][0]
    return "the first samples"


# -- trackers --------------------------------------------------------------------------------------


def check_trackers(config: RunConfig) -> None:
    """``--use-wandb`` writes ``<output-dir>/wandb``: it must be (or become) a directory."""
    if not config.use_wandb:
        return
    from relax.config.run import output_dir_of

    where = output_dir_of(config) / "wandb"
    if where.exists() and not where.is_dir():
        raise PreflightError(
            f"--use-wandb writes its run to {where}, which is a file, not a directory; move the file away or "
            "choose another --output-dir"
        )


# -- reward hooks ----------------------------------------------------------------------------------


def check_hooks(config: RunConfig) -> None:
    """``--dynamic-sampling-filter-path`` / ``--custom-reward-post-process-path``: each hook can be
    called with the arguments the rollout passes it (``relax.rollout.hooks.HOOK_ARGUMENTS``)."""
    from relax.importing import load_attribute
    from relax.rollout.hooks import FILTER_FLAG, POST_PROCESS_FLAG, HookError, check_hook_signature

    for spec, flag in ((config.dynamic_sampling_filter_path, FILTER_FLAG),
                       (config.custom_reward_post_process_path, POST_PROCESS_FLAG)):
        if not spec:
            continue
        try:
            fn = load_attribute(spec, flag, expected="'package.module:function'", allow_dotted=True)
            check_hook_signature(fn, flag, spec)
        except (HookError, ValueError, ImportError) as exc:
            raise PreflightError(_first_line(exc)) from None


# -- Ray address -----------------------------------------------------------------------------------


# What --ray-address accepts besides host:port (with an optional scheme such as ray://).
RAY_ADDRESS_WORDS = ("auto", "local")


def check_ray_address_format(address: str) -> None:
    """``--ray-address``: ``auto``, ``local`` or ``[scheme://]host:port`` (Ray's own check comes only
    after start-up, as a traceback)."""
    if address in RAY_ADDRESS_WORDS:
        return
    target = address.split("://", 1)[-1].rstrip("/")
    host, _, port = target.rpartition(":")
    if not host.strip("[]") or not port.isdigit() or not 0 < int(port) < 65536 or any(c.isspace() for c in host):
        raise PreflightError(
            f"--ray-address {address} is not an address: give the head node's host:port (e.g. 127.0.0.1:6379, "
            "as `ray start --head` prints it), ray://host:10001 for Ray Client, or auto; omit --ray-address to "
            "start a local Ray"
        )


def check_ray(config: RunConfig) -> None:
    if not config.ray_address:
        return
    check_ray_address_format(config.ray_address)
    from relax.runtime.ray_session import check_ray_address

    try:
        check_ray_address(config.ray_address)
    except ConnectionError as exc:
        raise PreflightError(str(exc)) from None


# -- all of it -------------------------------------------------------------------------------------


def check_env(config: RunConfig, prompts: list) -> None:
    """``--env-path`` (or the task's environment): built, reset on a real prompt, stepped once."""
    from relax.rollout.environments.preflight import check_environment

    try:
        check_environment(config, prompts)
    except (ValueError, RuntimeError) as exc:  # the loader's and EpisodeError's messages name flag and sample
        raise PreflightError(_first_line(exc)) from None


def is_multi_turn(config: RunConfig) -> bool:
    from relax.rollout.environments import is_multi_turn as multi_turn

    return multi_turn(config)


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
    prompts = load_prompts(config, tokenizer, warnings)
    prompts = prompts + check_eval_prompts(config, tokenizer, warnings)  # the reward scores both
    if is_multi_turn(config):  # the environment's rewards score the episodes: reset + one step
        check_env(config, prompts)
    else:
        check_reward(config, prompts)
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
