"""Reward functions: loading a user function, calling it, and checking what it returns.

Built-in and user reward functions share one signature (see ``relax.rollout.base``)::

    def reward(prompt: str, completion: str, label, metadata: Mapping) -> float | Mapping[str, float]

``async def`` works too. A plain number is the single component ``"reward"``. The returned values
become a float64 ``[N, K]`` matrix whose columns follow ``reward_keys``. Every bad value stops the
run with the sample index, the function's name, the key and the value (docs/design.md §3); nothing is
silently replaced.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import numbers
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from relax.importing import load_attribute

SCALAR_REWARD_KEY = "reward"
FLOAT32_MAX = float(torch.finfo(torch.float32).max)

RewardFunction = Callable[[str, str, Any, Mapping], Any]


class RewardError(ValueError):
    """A reward function raised or returned something that cannot be trained on."""


def function_name(fn: Callable) -> str:
    """A readable name for error messages: ``module.qualname`` when available."""
    if isinstance(fn, TimedReward):
        fn = fn.fn
    qualname = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    module = getattr(fn, "__module__", None)
    return f"{module}.{qualname}" if module else qualname


def load_function(spec: str, flag: str = "--custom-rm-path") -> Callable:
    """Import ``package.module:function`` (or ``package.module.function``) and return the callable.

    ``flag`` is only used in error messages, so that a user sees which option to fix.
    """
    fn = load_attribute(
        spec, flag, expected="'package.module:function', e.g. 'my_rewards:score'", allow_dotted=True
    )
    if not callable(fn):
        attr = spec.replace(":", ".").rpartition(".")[2]
        raise ValueError(f"{flag} {spec!r}: {attr!r} is a {type(fn).__name__}, not a function")
    return fn


def load_reward_function(spec: str) -> RewardFunction:
    """Load the ``--custom-rm-path`` reward function and check it accepts the four arguments."""
    fn = load_function(spec, "--custom-rm-path")
    try:
        inspect.signature(fn).bind("prompt", "completion", None, {})
    except TypeError as exc:
        raise ValueError(
            f"--custom-rm-path {spec!r}: {function_name(fn)} must accept (prompt, completion, label, "
            f"metadata); its signature is {inspect.signature(fn)} ({exc})"
        ) from None
    except ValueError:  # builtins without a signature: nothing to check
        pass
    return fn


# -- calling -----------------------------------------------------------------------------------


def _run_coroutines(coroutines: list) -> list:
    """Await ``coroutines`` concurrently and return their results in order.

    Works both from plain code and from inside a running event loop (e.g. an async Ray actor), where
    ``asyncio.run`` is not allowed: then a helper thread runs its own loop.
    """

    async def gather():
        return await asyncio.gather(*coroutines, return_exceptions=True)

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(gather())
    box: dict[str, Any] = {}

    def target():
        try:
            box["result"] = asyncio.run(gather())
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="relax-reward-async")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["result"]


class TimedReward:
    """A reward function with ``--reward-timeout``: ``call_reward_function`` fails a call that takes
    longer than ``timeout`` seconds (naming the function and the sample) instead of waiting forever."""

    def __init__(self, fn: RewardFunction, timeout: float):
        self.fn, self.timeout = fn, float(timeout)

    def __call__(self, prompt, completion, label, metadata):
        return self.fn(prompt, completion, label, metadata)


def with_timeout(fn: RewardFunction, timeout: float | None) -> RewardFunction:
    """``fn`` with ``--reward-timeout`` attached (unchanged when ``timeout`` is None)."""
    return TimedReward(fn, timeout) if timeout else fn


def _unwrap(fn) -> tuple[RewardFunction, float | None]:
    if isinstance(fn, TimedReward):
        return fn.fn, fn.timeout
    return fn, None


def _short(text, limit: int = 60) -> str:
    text = repr(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _call_in_threads(call: Callable[[int], Any], n: int, workers: int, timeout: float | None,
                     failed: Callable, timed_out: Callable) -> list:
    """Run ``call(i)`` for ``i < n`` in ``workers`` daemon threads and return the values in order.

    The first failure (in sample order) is raised; with ``timeout``, a call running longer than that
    raises ``timed_out(i)`` without waiting for it (its thread is a daemon and is abandoned, so the
    process can still exit)."""
    values: list = [None] * n
    errors: dict[int, BaseException] = {}
    starts: dict[int, float] = {}
    done = [threading.Event() for _ in range(n)]
    order = iter(range(n))
    lock = threading.Lock()
    stop = threading.Event()

    def worker():
        while not stop.is_set():
            with lock:
                i = next(order, None)
            if i is None:
                return
            starts[i] = time.monotonic()
            try:
                values[i] = call(i)
            except BaseException as exc:  # noqa: BLE001 - re-raised in sample order by the caller
                errors[i] = exc
            done[i].set()

    for _ in range(max(1, min(workers, n))):
        threading.Thread(target=worker, name="relax-reward", daemon=True).start()
    try:
        for i in range(n):
            while True:
                started = starts.get(i)
                if timeout is None:
                    wait = None
                elif started is None:
                    wait = 0.05  # queued behind other calls, each of them bounded
                else:
                    wait = max(0.0, started + timeout - time.monotonic())
                if done[i].wait(wait):
                    break
                if started is not None and time.monotonic() - started >= timeout:
                    raise timed_out(i)
            if i in errors:
                raise failed(i, errors[i]) from errors[i]
    finally:
        stop.set()
    return values


def call_reward_function(
    fn: RewardFunction,
    prompts: Sequence[str],
    completions: Sequence[str],
    labels: Sequence[Any],
    metadata: Sequence[Mapping],
    concurrency: int = 1,
) -> list:
    """Call ``fn`` once per sample and return the raw values, in sample order.

    A plain function runs in a pool of ``concurrency`` threads (1: one call after the other; a slow
    judge, e.g. an HTTP call, then overlaps with the others); an ``async`` function's coroutines are
    gathered on one event loop. Either way the values come back in sample order, so the result does
    not depend on which call finished first. A raising call becomes a ``RewardError`` naming the
    sample index and the function, chained to the original exception. With ``--reward-timeout``
    (``fn`` wrapped by ``with_timeout``) a call that takes longer is a ``RewardError`` too.
    """
    n = len(prompts)
    if not (len(completions) == len(labels) == len(metadata) == n):
        raise ValueError(
            f"call_reward_function needs equally long inputs, got prompts={n}, completions="
            f"{len(completions)}, labels={len(labels)}, metadata={len(metadata)}"
        )
    fn, timeout = _unwrap(fn)
    name = function_name(fn)

    def failed(i: int, exc: BaseException) -> RewardError:
        return RewardError(f"sample {i}: reward function {name} raised {type(exc).__name__}: {exc}")

    def timed_out(i: int) -> RewardError:
        return RewardError(
            f"sample {i}: reward function {name} did not return within --reward-timeout {timeout:g}s "
            f"(prompt {_short(prompts[i])}, completion {_short(completions[i])}); make the function "
            "faster or give it its own time limit, or raise --reward-timeout"
        )

    def call(i: int):
        return fn(prompts[i], completions[i], labels[i], metadata[i])

    values: list = [None] * n
    if (concurrency > 1 and n > 1) or timeout is not None:
        values = _call_in_threads(call, n, concurrency, timeout, failed, timed_out)
    else:
        for i in range(n):
            try:
                values[i] = call(i)
            except (Exception, SystemExit) as exc:  # a user function that exits is a failing call too
                raise failed(i, exc) from exc
    pending = {i: v for i, v in enumerate(values) if inspect.isawaitable(v)}
    if pending:
        coroutines = list(pending.values())
        if timeout is not None:
            coroutines = [asyncio.wait_for(c, timeout) for c in coroutines]
        results = _run_coroutines(coroutines)
        for i, result in zip(pending, results):
            if timeout is not None and isinstance(result, (asyncio.TimeoutError, TimeoutError)):
                raise timed_out(i)
            if isinstance(result, BaseException):
                raise failed(i, result) from result
            values[i] = result
    return values


# -- checking ----------------------------------------------------------------------------------


def _is_bool(value) -> bool:
    # numpy.bool_ is neither bool nor numbers.Real; catch it by name so the message says "bool".
    return isinstance(value, bool) or type(value).__name__ in ("bool_", "bool")


def _as_float(value, *, index: int, name: str, key: str) -> float:
    where = f"sample {index}: reward function {name} returned {key!r} = {value!r}"
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.dtype == torch.bool:
            raise RewardError(f"{where}; expected a number (a one-element, non-bool tensor at most)")
        value = value.item()
    if _is_bool(value):
        raise RewardError(f"{where}, a bool; return a number instead (e.g. float({value!r}))")
    if not isinstance(value, numbers.Real):
        raise RewardError(f"{where} of type {type(value).__name__}; expected a real number")
    number = float(value)
    if not math.isfinite(number):
        raise RewardError(
            f"{where}, which is not finite; fix the reward function (relax never replaces NaN/inf)"
        )
    if abs(number) > FLOAT32_MAX:
        raise RewardError(
            f"{where}, which overflows float32 (|value| > {FLOAT32_MAX:.4e}); rescale the reward"
        )
    return number


def reward_matrix(
    values: Sequence[Any], reward_keys: Sequence[str], function: str = "reward function"
) -> torch.Tensor:
    """Turn per-sample reward values into a float64 ``[N, K]`` matrix in ``reward_keys`` order.

    Each value is a number (the component ``"reward"``) or a mapping ``key -> number``; extra keys
    in a mapping are allowed (e.g. a score only used for logging). ``function`` names the reward
    function in error messages.
    """
    keys = tuple(reward_keys)
    if not keys:
        raise ValueError("reward_keys must name at least one reward component")
    rows = []
    for i, value in enumerate(values):
        if isinstance(value, Mapping):
            components = value
        elif _is_bool(value) or isinstance(value, (numbers.Real, torch.Tensor)):
            components = {SCALAR_REWARD_KEY: value}
        else:
            raise RewardError(
                f"sample {i}: reward function {function} returned {value!r} of type {type(value).__name__}; "
                "expected a number or a mapping of reward component name -> number"
            )
        row = []
        for key in keys:
            if key not in components:
                got = ", ".join(map(str, components)) or "nothing"
                raise RewardError(
                    f"sample {i}: reward function {function} returned no component {key!r} (it returned: "
                    f"{got}); the configured reward keys are {', '.join(keys)} (--reward-keys)"
                )
            row.append(_as_float(components[key], index=i, name=function, key=key))
        rows.append(row)
    return torch.tensor(rows, dtype=torch.float64).reshape(len(rows), len(keys))


def score(
    fn: RewardFunction,
    prompts: Sequence[str],
    completions: Sequence[str],
    labels: Sequence[Any],
    metadata: Sequence[Mapping],
    reward_keys: Sequence[str],
    concurrency: int = 1,
) -> torch.Tensor:
    """Call ``fn`` on every sample and return the checked float64 ``[N, K]`` reward matrix."""
    values = call_reward_function(fn, prompts, completions, labels, metadata, concurrency)
    return reward_matrix(values, reward_keys, function_name(fn))
