"""Calling many episodes' environments at once: plain methods or coroutines, a per-call time limit,
and errors that name the environment, the episode, the turn and the training step."""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

# Plain methods run in threads only with --env-timeout (a thread is what can be abandoned).
MAX_THREADS = 32


class EpisodeError(RuntimeError):
    """An environment raised, returned something unusable, or ran past ``--env-timeout``."""


def raised(exc: BaseException) -> str:
    """What user code did, for a message: ``raised KeyError: 'x'``, or, for ``sys.exit()`` /
    ``exit()``, that it tried to end the process (which would take the rollout worker with it)."""
    if isinstance(exc, SystemExit):
        return (f"called sys.exit({exc.code!r}) (SystemExit), which would end the rollout worker's process; "
                "an environment reports the end of an episode with EnvStep(done=True), or raises")
    return f"raised {type(exc).__name__}: {exc}"


class _LoopThread:
    """One event loop in a daemon thread for all of a runner's coroutines, so an environment may keep
    loop-bound resources (a client session) from one turn to the next, and a caller that is itself
    inside an event loop (an async actor) can still wait for them."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="relax-env-loop", daemon=True).start()

    def submit(self, coroutine, timeout: float | None) -> Future:
        if timeout is not None:
            coroutine = asyncio.wait_for(coroutine, timeout)
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)


class EnvCaller:
    """``call(method, envs, args, turn)`` -> each episode's return value, in episode order."""

    def __init__(self, env_name: str, timeout: float | None, describe: Callable[[int], str]):
        self.env_name, self.timeout, self.describe = env_name, timeout, describe
        self.step: int | None = None
        self._loop: _LoopThread | None = None
        self._pool: ThreadPoolExecutor | None = None

    def where(self, episode: int, turn: int | None, method: str) -> str:
        parts = [f"environment {self.env_name}", f"episode {episode} ({self.describe(episode)})"]
        if turn is not None:
            parts.append(f"turn {turn}")
        if self.step is not None:
            parts.append(f"training step {self.step}")
        return ", ".join(parts) + f": {method}()"

    def call(self, method: str, envs: Sequence[Any], episodes: Sequence[int], args: Sequence[tuple],
             turn: int | None) -> list:
        values = self._call_plain(method, envs, episodes, args, turn)
        pending = [k for k, v in enumerate(values) if inspect.isawaitable(v)]
        if pending:
            if self._loop is None:
                self._loop = _LoopThread()
            futures = {k: self._loop.submit(values[k], self.timeout) for k in pending}
            for k, future in futures.items():
                try:
                    values[k] = future.result()
                except TimeoutError:
                    raise self._timed_out(method, episodes[k], turn) from None
                except (Exception, SystemExit) as exc:  # an environment that exits fails like one that raises
                    raise self._raised(method, episodes[k], turn, exc) from exc
        return values

    def _call_plain(self, method, envs, episodes, args, turn) -> list:
        if self.timeout is None:
            values = []
            for env, e, a in zip(envs, episodes, args):
                try:
                    values.append(getattr(env, method)(*a))
                except (Exception, SystemExit) as exc:  # an environment that exits fails like one that raises
                    raise self._raised(method, e, turn, exc) from exc
            return values
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=MAX_THREADS, thread_name_prefix="relax-env")
        started: dict[int, float] = {}

        def run(k):
            started[k] = time.monotonic()
            return getattr(envs[k], method)(*args[k])

        futures = [self._pool.submit(run, k) for k in range(len(envs))]
        values = []
        for k, future in enumerate(futures):
            while True:
                begun = started.get(k)
                wait = 0.05 if begun is None else max(0.0, begun + self.timeout - time.monotonic())
                try:
                    values.append(future.result(timeout=wait))
                    break
                except TimeoutError:
                    if begun is not None and time.monotonic() - begun >= self.timeout:
                        for f in futures:
                            f.cancel()
                        raise self._timed_out(method, episodes[k], turn) from None
                except (Exception, SystemExit) as exc:  # an environment that exits fails like one that raises
                    raise self._raised(method, episodes[k], turn, exc) from exc
        return values

    def close(self) -> None:
        """Stop the loop thread and the pool (a call still running past its time limit is abandoned)."""
        if self._loop is not None:
            self._loop.loop.call_soon_threadsafe(self._loop.loop.stop)
            self._loop = None
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def _raised(self, method, episode, turn, exc) -> EpisodeError:
        return EpisodeError(f"{self.where(episode, turn, method)} {raised(exc)}")

    def _timed_out(self, method, episode, turn) -> EpisodeError:
        return EpisodeError(
            f"{self.where(episode, turn, method)} did not return within --env-timeout {self.timeout:g}s; "
            "make the environment faster or raise --env-timeout")
