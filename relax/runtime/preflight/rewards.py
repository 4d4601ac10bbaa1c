"""Pre-flight of what scores the samples: the reward function called on a few real prompts (its
values through the run's own checks), or the multi-turn environment reset and stepped once."""

from __future__ import annotations

import threading

from relax.config.run import RunConfig
from relax.runtime.preflight.common import PreflightError, builtin_task, first_line

# How long pre-flight waits for the reward function's calls.
REWARD_PREFLIGHT_TIMEOUT_S = 60.0


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
    from relax.rollout.factory import function_reward_setup
    from relax.rollout.reward_services import check_function_values, services_of
    from relax.rollout.rewards import RewardError, call_reward_function, function_name

    if not config.custom_rm_path:
        builtin_task(config)  # a clear message for an unknown --task before reward_setup looks it up
    fn, keys = function_reward_setup(config)  # the components no reward service fills
    services = services_of(config)
    if services and not keys:
        return  # every component comes from a service: the function is never called
    name = function_name(fn)
    flag = f"--custom-rm-path {config.custom_rm_path}" if config.custom_rm_path else f"--task {config.task}"
    if not config.custom_rm_path:
        produced = builtin_task(config).reward_keys
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
        check_function_values(values, fn, keys, services)
    except RewardError as exc:
        raise PreflightError(f"{flag}: pre-flight call on {_sample_of(exc, samples)}: {_message(exc)}") from None


def _message(exc: BaseException) -> str:
    """A RewardError's message without its ``sample i:`` prefix (pre-flight names the sample itself)."""
    import re

    return re.sub(r"^sample \d+: ", "", first_line(exc))


def _sample_of(exc: BaseException, samples: list) -> str:
    """``sample i`` in a RewardError message -> the prompt's file/line (or task index) and completion."""
    import re

    match = re.match(r"sample (\d+):", str(exc))
    if match and int(match.group(1)) < len(samples):
        return samples[int(match.group(1))][0]
    return "the first samples"


def check_env(config: RunConfig, prompts: list) -> None:
    """``--env-path`` (or the task's environment): built, reset on a real prompt, stepped once."""
    from relax.rollout.environments.preflight import check_environment

    try:
        check_environment(config, prompts)
    except (ValueError, RuntimeError) as exc:  # the loader's and EpisodeError's messages name flag and sample
        raise PreflightError(first_line(exc)) from None


def is_multi_turn(config: RunConfig) -> bool:
    from relax.rollout.environments import is_multi_turn as multi_turn

    return multi_turn(config)
