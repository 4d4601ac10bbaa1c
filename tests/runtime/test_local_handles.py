"""Ray's calling convention in one process (``--in-process``): calls are queued and run in the order
they were made when a result is read, references among the arguments are resolved first, two return
values split a 2-tuple, a failure stays with its references and reaches ``waits.get`` as Ray's does,
and a signal during a call is delivered after it returns."""

from __future__ import annotations

import os
import signal

import pytest

from relax.runtime.session.local_handles import LocalHandle, LocalQueue, LocalRef
from relax.runtime.session.waits import WorkerDied, get


class _Worker:
    def __init__(self, log):
        self.log = log

    def add(self, a, b):
        self.log.append(("add", a, b))
        return a + b

    def pair(self, x):
        self.log.append(("pair", x))
        return x, 10 * x

    def boom(self, x):
        raise ValueError(f"bad {x}")

    def signal_me(self):
        os.kill(os.getpid(), signal.SIGINT)
        self.log.append("finished after the signal")
        return 1


def test_calls_run_in_submission_order_when_a_result_is_read():
    log, queue = [], LocalQueue()
    a, b = LocalHandle(_Worker(log), queue), LocalHandle(_Worker(log), queue)
    first = a.add.remote(1, 2)
    small, big = b.pair.options(num_returns=2).remote(first)  # a reference argument: its value (3)
    last = a.add.remote(big, 5)
    assert log == []  # nothing ran yet
    assert isinstance(last, LocalRef)
    assert get(small, "rollout") == 3
    assert log == [("add", 1, 2), ("pair", 3)]  # only what the read needed, oldest first
    assert get([last, big], "actor") == [35, 30]
    assert log[-1] == ("add", 30, 5)
    assert get([], "reference/critic") == []  # nothing to wait for, and no Ray


def test_a_failed_call_fails_its_dependants_and_is_reported_like_a_worker_failure():
    queue = LocalQueue()
    worker = LocalHandle(_Worker([]), queue)
    failed = worker.boom.remote(7)
    after = worker.add.remote(failed, 1)
    with pytest.raises(WorkerDied, match=r"the rollout worker failed: ValueError: bad 7") as info:
        get(after, "rollout")
    assert isinstance(info.value.__cause__, ValueError)  # the user's exception, with its traceback
    with pytest.raises(WorkerDied, match="bad 7"):
        get(failed, "rollout")


@pytest.fixture
def python_sigint():
    """SIGINT as a fresh Python process has it (``default_int_handler``, not blocked), whatever the test
    process's earlier tests or libraries left; put back afterwards."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    blocked = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    yield
    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    signal.signal(signal.SIGINT, previous)


def test_a_signal_during_a_call_is_delivered_after_the_call_returns(python_sigint):
    log, queue = [], LocalQueue()
    worker = LocalHandle(_Worker(log), queue)
    ref = worker.signal_me.remote()
    with pytest.raises(KeyboardInterrupt):
        ref.value()
    assert log == ["finished after the signal"]  # the call was not cut half-way
    assert ref.value() == 1  # and its result is kept
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
