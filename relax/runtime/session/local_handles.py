"""Ray's calling convention for objects in this process (``--in-process``, ``relax.runtime.cluster.local_runtime``).

``LocalHandle(obj).method.remote(*args)`` queues the call and returns a ``LocalRef`` at once, as Ray
does; ``.options(num_returns=2)`` gives one reference per item of the returned 2-tuple. Queued calls
run one after the other in the order they were made (``LocalQueue``) when a reference is read
(``relax.runtime.session.waits.get``), its arguments' references resolved first. The order is the one Ray's
actors keep (each runs its calls in submission order, and a call's arguments were submitted before
it), so every worker sees the calls of the Ray path in the same order, with the same values.

Running the calls when a result is read, not when they are made, keeps an interrupt consistent: a
Ctrl-C or SIGTERM that arrives during a call is held until the call returns
(``relax.runtime.session.held_signals``), so no worker is left half-way through a step, and the run
can finish the steps it submitted and save them as the Ray path does.
"""

from __future__ import annotations

from collections import deque

from relax.runtime.session.held_signals import signals_held

_UNSET = object()


class LocalRef:
    """A queued call's result: its value, or the exception it raised (raised again by ``value()``)."""

    __slots__ = ("_error", "_queue", "_value")

    def __init__(self, queue: LocalQueue):
        self._queue, self._value, self._error = queue, _UNSET, None

    def _set(self, value=None, error: BaseException | None = None) -> None:
        self._value, self._error = value, error

    def value(self):
        if self._value is _UNSET and self._error is None:
            self._queue.run_until(self)
        if self._error is not None:
            raise self._error
        return self._value


def resolve(x):
    """``x``'s value when it is a ``LocalRef`` (a list or tuple of them: each), else ``x``."""
    if isinstance(x, LocalRef):
        return x.value()
    if isinstance(x, (list, tuple)) and any(isinstance(r, LocalRef) for r in x):
        return [resolve(r) for r in x]
    return x


def is_local(refs) -> bool:
    return isinstance(refs, LocalRef) or (isinstance(refs, (list, tuple)) and bool(refs)
                                          and all(isinstance(r, LocalRef) for r in refs))


class LocalQueue:
    """The calls made and not run yet, oldest first."""

    def __init__(self):
        self._calls: deque = deque()

    def submit(self, fn, args, kwargs, num_returns: int) -> list[LocalRef]:
        refs = [LocalRef(self) for _ in range(num_returns)]
        self._calls.append((fn, args, kwargs, refs))
        return refs

    def run_until(self, ref: LocalRef) -> None:
        while ref._value is _UNSET and ref._error is None:
            if not self._calls:
                raise RuntimeError("a local reference whose call is not queued (a bug in relax)")
            fn, args, kwargs, refs = self._calls[0]
            with signals_held():  # the call and its results are kept whole; the signal comes after
                self._calls.popleft()
                try:
                    args = [resolve(a) for a in args]
                    kwargs = {k: resolve(v) for k, v in kwargs.items()}
                    values = [fn(*args, **kwargs)]
                    if len(refs) > 1:
                        values = list(values[0])
                        if len(values) != len(refs):
                            raise ValueError(f"{fn.__qualname__} returned {len(values)} values, not "
                                             f"num_returns={len(refs)}")
                except Exception as exc:  # noqa: BLE001 - kept in the references, raised where they are read
                    for r in refs:
                        r._set(error=exc)
                    continue
                for r, v in zip(refs, values):
                    r._set(v)

    def drain(self) -> None:
        """Run every queued call (their errors stay in their references)."""
        while self._calls:
            self.run_until(self._calls[-1][3][0])


class _Method:
    def __init__(self, queue: LocalQueue, fn, num_returns: int = 1):
        self._queue, self._fn, self._num_returns = queue, fn, num_returns

    def options(self, *, num_returns: int = 1) -> _Method:
        return _Method(self._queue, self._fn, num_returns)

    def remote(self, *args, **kwargs):
        refs = self._queue.submit(self._fn, args, kwargs, self._num_returns)
        return refs[0] if self._num_returns == 1 else refs


class LocalHandle:
    """``obj`` behind Ray's actor-handle interface: ``handle.method.remote(...)`` -> ``LocalRef``."""

    def __init__(self, obj, queue: LocalQueue):
        self.obj, self._queue = obj, queue

    def __getattr__(self, name: str) -> _Method:
        if name.startswith("_"):
            raise AttributeError(name)
        return _Method(self._queue, getattr(self.obj, name))


class Finished:
    """A finished call, answering ``result()`` like the Serve response the actor rank waits on."""

    def __init__(self, value):
        self._value = value

    def result(self):
        return self._value


class InProcessAdvantages:
    """The advantages deployment's interface (``compute.remote(...).result()``) on an
    ``AdvantagesCore`` in this process: the actor rank calls it exactly as it calls Serve."""

    def __init__(self, core):
        self.compute = self  # ``handle.compute.remote(...)``
        self._core = core

    def remote(self, *args, **kwargs):
        return Finished(self._core.compute(*args, **kwargs))
