"""Bounded waits of the driver: ``get`` turns a dead worker, a worker whose heartbeat stopped
(``relax.runtime.session.heartbeat``), a step that makes no progress, or a dead TransferQueue component,
into one error naming it (with "still waiting" lines before it gives up); ``BackgroundCall`` runs driver work off the critical path without letting it
hang the run or its exit; ``bounded`` runs a shutdown step for at most a few seconds."""

from __future__ import annotations

import contextlib
import threading
import time

from relax.runtime.files.console import log
from relax.runtime.session.local_handles import is_local, resolve


class WorkerDied(RuntimeError):
    pass


class WorkerUnresponsive(WorkerDied):
    """A worker that is alive but stopped answering (its heartbeat stopped, or its step never ends)."""


_HEARTBEATS: list = []  # the run's ``Heartbeats`` (none: no heartbeat checks)


def watch_heartbeats(heartbeats) -> None:
    """Check ``heartbeats`` (a ``relax.runtime.session.heartbeat.Heartbeats``; None: stop) in every wait."""
    _HEARTBEATS[:] = [heartbeats] if heartbeats is not None else []


class Patience:
    """How long one step may take before the run calls it stuck, although every worker's heartbeat
    goes on (a deadlocked thread, a collective waiting for a peer): ten times ``--worker-timeout``,
    or twenty times the slowest step so far when that is longer, so that a slow step on a loaded
    machine is no false alarm."""

    def __init__(self, worker_timeout: float):
        self.floor = 10 * worker_timeout
        self.slowest = 0.0

    def observe(self, seconds: float) -> None:
        self.slowest = max(self.slowest, seconds)

    def deadline(self) -> tuple[float, float, float]:
        """``(start, limit in seconds, slowest step)`` for ``get(..., progress=...)``."""
        return time.monotonic(), max(self.floor, 20 * self.slowest), self.slowest


# Components whose death fails every driver wait within seconds (``watch_components``): the
# TransferQueue controller and storage units. A dead worker already fails its own call; a dead
# TransferQueue component would only make the workers wait on it (minutes of retries).
LIVENESS_POLL_S = 2.0
_WATCHED: list[tuple[str, object]] = []


def watch_components(components: list[tuple[str, object]]) -> None:
    """``[(description, actor handle)]`` checked while the driver waits (empty: none)."""
    _WATCHED[:] = components


def dead_component() -> str | None:
    """The description of a watched component whose actor is dead, else None. A component busy
    with other calls (no answer within a second) counts as alive."""
    if not _WATCHED:
        return None
    import ray
    from ray.exceptions import RayActorError

    pings = []
    for name, handle in _WATCHED:
        try:
            pings.append((name, handle.__ray_ready__.remote()))
        except RayActorError:
            return name
    ready, _ = ray.wait([ref for _, ref in pings], num_returns=len(pings), timeout=1.0)
    ready = set(ready)
    for name, ref in pings:
        if ref in ready:
            try:
                ray.get(ref, timeout=0)
            except RayActorError:
                return name
            except Exception:  # noqa: BLE001, S110 - anything but "the actor is dead" is not our business here
                pass
    return None


DEAD_PEER_WAIT_S = 10.0  # how long a failed call waits for Ray to report the worker that died behind it


def dead_worker(wait_s: float = DEAD_PEER_WAIT_S) -> str | None:
    """The watched worker (``watch_heartbeats``) that Ray reports dead, if any, as ``the actor rank 1
    (pid ...)``. One worker's death often reaches the driver first as a *peer's* error (the survivor
    of a collective: gloo's ``Connection closed by peer``), so a failed call asks this before it
    blames the worker whose call failed. Live workers answer a ping once they are idle; a dead one
    fails it as soon as Ray knows, which can take a few seconds."""
    workers = [w for heartbeats in _HEARTBEATS for w in heartbeats.workers]
    if not workers:
        return None
    import ray
    from ray.exceptions import RayActorError

    pings = {}
    for worker in workers:
        try:
            pings[worker.handle.__ray_ready__.remote()] = worker
        except RayActorError:
            return worker.describe()
    deadline = time.monotonic() + wait_s
    pending = list(pings)
    while pending and time.monotonic() < deadline:
        ready, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
        for ref in ready:
            try:
                ray.get(ref, timeout=0)
            except RayActorError:
                return pings[ref].describe()
            except Exception:  # noqa: BLE001, S110 - only "the actor is dead" is asked here
                pass
    return None


def _check_progress(what: str, progress, warned: list) -> None:
    """Heartbeats and the step's deadline while waiting for ``what``: "still waiting" lines, then
    ``WorkerUnresponsive`` naming the worker (or the step)."""
    for heartbeats in _HEARTBEATS:
        for line in heartbeats.still_waiting_lines(f"the {what}"):
            log(line)
        message = heartbeats.unresponsive()
        if message is not None:
            raise WorkerUnresponsive(message)
    if progress is None:
        return
    start, limit, slowest = progress
    waited = time.monotonic() - start
    if waited >= limit:
        places = "; ".join(p for p in (getattr(h, "places", lambda: "")() for h in _HEARTBEATS) if p)
        raise WorkerUnresponsive(
            f"the {what} made no progress for {waited:.0f}s although every worker's heartbeat goes on (the slowest "
            f"step so far took {slowest:.1f}s; the limit is the larger of 10 x --worker-timeout and 20 x that)"
            + (f"; the workers are at: {places}" if places else "") + ". User code that never returns (an "
            "environment, a reward function, a hook) is bounded by --env-timeout, --reward-timeout and "
            "--hook-timeout; otherwise a deadlock in a worker or a collective waiting for a peer: restart the run, "
            "with --load to resume"
        )
    if waited >= limit / 2 and not warned:
        warned.append(True)
        log(f"relax: still waiting for the {what} after {waited:.0f}s (the slowest step so far took {slowest:.1f}s); "
            f"the run ends at {limit:.0f}s without progress")


def _wait_watching(refs, timeout: float | None, what: str = "worker", progress=None) -> None:
    """Wait until every ref is ready (or ``timeout``), checking the watched components' liveness,
    the workers' heartbeats and the step's deadline every ``LIVENESS_POLL_S`` seconds; a dead
    component raises ``WorkerDied``, a silent worker or a stuck step ``WorkerUnresponsive``."""
    import ray

    pending = list(dict.fromkeys(refs if isinstance(refs, (list, tuple)) else [refs]))
    deadline = None if timeout is None else time.monotonic() + timeout
    warned: list = []
    while pending:
        wait = LIVENESS_POLL_S if deadline is None else min(LIVENESS_POLL_S, deadline - time.monotonic())
        if wait <= 0:
            return  # ray.get reports the timeout
        ready, pending = ray.wait(pending, num_returns=len(pending), timeout=wait)
        if ready:
            ray.get(ready)  # a failed call fails now, not after the others
        if pending:
            dead = dead_component()
            if dead is not None:
                raise WorkerDied(
                    f"the {dead} died; the run cannot continue without it (its data is lost). See the log "
                    "lines above for why (e.g. out of memory); restart the run, with --load to resume from "
                    "the last checkpoint"
                )
            _check_progress(what, progress, warned)


def get(refs, what: str, timeout: float | None = None, progress=None):
    """``ray.get`` that turns a dead worker, a silent one, a step past its ``progress`` deadline
    (``Patience.deadline()``) or a dead watched component (TransferQueue) into one clear error
    naming it."""
    if is_local(refs) or (isinstance(refs, (list, tuple)) and not refs):
        return _get_local(refs, what)  # --in-process (relax.runtime.session.local_handles); no Ray
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

    try:
        if _WATCHED or _HEARTBEATS or progress is not None:
            _wait_watching(refs, timeout, what, progress)
        return ray.get(refs, timeout=timeout)
    except RayActorError as exc:
        raise WorkerDied(f"the {what} worker died: {exc}. See the worker log lines above.") from exc
    except RayTaskError as exc:
        cause = exc.as_instanceof_cause() if hasattr(exc, "as_instanceof_cause") else exc
        dead = dead_worker()
        if dead is not None:  # the failure is a survivor's report of its peer's death
            failed = type(getattr(exc, "cause", None) or cause).__name__
            raise WorkerDied(
                f"{dead} died, and the {what} worker failed after it ({failed}). "
                "See the log lines above for why (e.g. out of memory); restart the run, with --load to resume from "
                "the last checkpoint"
            ) from exc
        raise WorkerDied(f"the {what} worker failed: {type(cause).__name__}: {cause}") from exc
    except GetTimeoutError as exc:
        raise WorkerDied(
            f"the {what} worker did not answer within {timeout:.0f}s (not enough Ray CPUs for every worker, or "
            "stuck); check `ray status`"
        ) from exc


def _get_local(refs, what: str):
    """``get`` on the references of ``--in-process`` calls: run them here; a failure is reported as the
    Ray path reports a failed worker call (the original exception stays the cause)."""
    try:
        return resolve(refs)
    except Exception as exc:
        raise WorkerDied(f"the {what} worker failed: {type(exc).__name__}: {exc}") from exc


class BackgroundCall:
    """One call at a time off the driver's critical path, in a *daemon* thread: a call that hangs on
    a dead TransferQueue component can neither block the driver's next wait (``wait`` checks the
    watched components, as ``get`` does) nor keep the process from exiting (a thread pool's
    workers are joined at interpreter exit, so a stuck one would hang ``relax train`` after it has
    reported the error)."""

    def __init__(self, what: str):
        self.what = what
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def submit(self, fn, *args) -> None:
        """Start ``fn(*args)`` after the previous call finished (``wait``)."""
        self.wait()
        self._thread = threading.Thread(target=self._run, args=(fn, *args), name=f"relax-{self.what}", daemon=True)
        self._thread.start()

    def _run(self, fn, *args) -> None:
        try:
            fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the driver by wait()
            self._error = exc

    def wait(self) -> None:
        """Until the call in flight finished; re-raises its error. A watched component that died
        meanwhile raises ``WorkerDied`` naming it (the call is left to its daemon thread)."""
        thread = self._thread
        while thread is not None and thread.is_alive():
            thread.join(LIVENESS_POLL_S)
            if thread.is_alive() and (dead := dead_component()) is not None:
                raise WorkerDied(f"the {dead} died while {self.what}; the run cannot continue without it")
        self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error


STOP_STEP_TIMEOUT_S = 20.0


def bounded(fn, what: str, timeout: float = STOP_STEP_TIMEOUT_S) -> bool:
    """Run ``fn`` in a daemon thread for at most ``timeout`` seconds (errors are ignored: this is
    shutdown); returns whether it finished, and says so on stderr when it did not."""
    thread = threading.Thread(target=_quietly, args=(fn,), name="relax-stop", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        log(f"relax: warning: {what} did not finish within {timeout:.0f}s; skipped")
        return False
    return True


def _quietly(fn) -> None:
    with contextlib.suppress(Exception):
        fn()


def transferqueue_components() -> list[tuple[str, object]]:
    """The TransferQueue controller and (when this process started them) its storage units."""
    components = []
    with contextlib.suppress(Exception):
        import ray

        components.append(("TransferQueue controller (actor TransferQueueController)",
                           ray.get_actor("TransferQueueController", namespace="transfer_queue")))
    with contextlib.suppress(Exception):
        from transfer_queue import interface

        for backend in (interface._TQ_STORAGE or {}).values():
            for name, handle in dict(backend).items():
                components.append((f"TransferQueue storage unit (actor {name})", handle))
    return components
