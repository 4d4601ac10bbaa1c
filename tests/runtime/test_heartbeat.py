"""A frozen worker is named, not waited on in silence; no Ray process of a run outlives it (issue 25,
item 1).

Unit tests of the pieces first (where a thread is, a stopped process's state, the step deadline, the
reaper and its watchdog on plain processes); then the heartbeat on one actor of the shared cluster,
stopped with SIGSTOP; then ``relax train`` itself (its own Ray): its rollout worker stopped with
SIGSTOP ends the run with one line naming it, and no process of the run survives; a SIGKILL of the
driver leaves no Ray process behind either.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

from relax.runtime.session import heartbeat, reaper, waits

needs_proc = pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc (Linux)")


def _alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (independent of relax.runtime.session.reaper)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.1)


# -- pieces ---------------------------------------------------------------------------------------------


def test_where_names_the_relax_method_a_thread_is_in():
    inside = threading.Event()
    release = threading.Event()

    def busy_in_relax():
        # a relax frame (this test file is not relax, so call through a relax function)
        waits.bounded(lambda: (inside.set(), release.wait(10)), "test", timeout=10)

    thread = threading.Thread(target=busy_in_relax, daemon=True)
    thread.start()
    inside.wait(5)
    try:
        # the test thread itself is in test code, which is user code (not a library): it is named
        assert "test_where_names_the_relax_method_a_thread_is_in" in heartbeat.where(threading.get_ident())
        assert "bounded" in heartbeat.where(thread.ident)  # relax/runtime/session/waits.py, joining its helper
        assert "relax/runtime/session/waits.py:" in heartbeat.where(thread.ident)
    finally:
        release.set()
        thread.join(5)


@needs_proc
def test_process_state_tells_a_stopped_process():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _wait_until(lambda: _alive(child.pid), 10, "the child")
        assert heartbeat.process_state(child.pid, None) is None  # running or sleeping: nothing to add
        os.kill(child.pid, signal.SIGSTOP)
        _wait_until(lambda: heartbeat.process_state(child.pid, None) is not None, 10, "the stop")
        assert heartbeat.process_state(child.pid, None) == "its process is stopped (state T: SIGSTOP, or a debugger)"
    finally:
        child.kill()
        child.wait()
    assert heartbeat.process_state(child.pid, None) is None  # gone


def test_patience_grows_with_the_slowest_step():
    patience = waits.Patience(worker_timeout=6)
    start, limit, slowest = patience.deadline()
    assert (limit, slowest) == (60, 0.0) and abs(start - time.monotonic()) < 1
    patience.observe(2.0)
    patience.observe(4.0)
    patience.observe(1.0)
    assert patience.deadline()[1:] == (80.0, 4.0)  # 20 x the slowest step once that is above 10 x timeout


def test_a_step_past_its_deadline_says_so_first(ray_cluster, capsys):
    import ray

    @ray.remote(num_cpus=0)
    class Slow:
        def sleep(self, seconds):
            time.sleep(seconds)

    slow = Slow.remote()
    try:
        ray.get(slow.sleep.remote(0))
        waits.LIVENESS_POLL_S, saved = 0.2, waits.LIVENESS_POLL_S
        try:
            with pytest.raises(waits.WorkerUnresponsive, match=r"^the rollout made no progress for [23]s although"):
                waits.get(slow.sleep.remote(30), "rollout", progress=(time.monotonic(), 2.0, 0.1))
        finally:
            waits.LIVENESS_POLL_S = saved
        assert "relax: still waiting for the rollout after 1s" in capsys.readouterr().err
    finally:
        ray.kill(slow)


FAKE_RAY = "import time; time.sleep(120)  # ray::FakeWorker"


@needs_proc
def test_the_reaper_finds_and_kills_the_ray_processes_below_a_process_only():
    ray_like = subprocess.Popen([sys.executable, "-c", FAKE_RAY, "ray::FakeWorker"])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        _wait_until(lambda: ray_like.pid in reaper.descendants(os.getpid()), 10, "the fake Ray child")
        found = reaper.descendants(os.getpid())
        assert other.pid not in found  # not a Ray process
        assert other.pid in reaper.descendants(os.getpid(), only_ray=False)
        # (not reaper.sweep(): with the shared test cluster up, this process's Ray is below it too)
        assert reaper.kill({ray_like.pid: found[ray_like.pid]}) == [ray_like.pid]
        assert ray_like.wait(10) == -signal.SIGKILL
        assert reaper.kill({ray_like.pid: found[ray_like.pid]}) == []  # gone: nothing to kill
        assert reaper.kill({other.pid: 1}) == []  # not the process that started at that time
        assert other.poll() is None
    finally:
        for child in (ray_like, other):
            child.kill()
            child.wait()


# A stand-in driver: starts the watchdog and a Ray-like grandchild (as raylet starts workers), prints
# the grandchild's pid, then waits to be killed.
FAKE_DRIVER = textwrap.dedent(
    f"""
    import subprocess, sys, time
    from relax.runtime.session.reaper import Watchdog
    watchdog = Watchdog()
    middle = subprocess.Popen([sys.executable, "-c",
        "import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', {FAKE_RAY!r}, 'ray::FakeWorker']);"
        " print(c.pid, flush=True); time.sleep(120)", "ray::FakeRaylet"], stdout=subprocess.PIPE, text=True)
    print(watchdog.pid, middle.pid, middle.stdout.readline().strip(), flush=True)
    if sys.argv[1] == "bye":
        middle.kill(); middle.wait()
        watchdog.close()
        print("closed", flush=True)
    time.sleep(120)
    """
)


@needs_proc
@pytest.mark.timeout(60)
def test_the_watchdog_kills_the_ray_processes_of_a_killed_driver():
    driver = subprocess.Popen([sys.executable, "-c", FAKE_DRIVER, "die"], stdout=subprocess.PIPE, text=True)
    watchdog, middle, worker = map(int, driver.stdout.readline().split())
    time.sleep(2.5)  # the watchdog notes the driver's Ray processes every second
    driver.kill()
    driver.wait()
    _wait_until(lambda: not _alive(worker) and not _alive(middle), 15, "the watchdog to kill the Ray processes")
    _wait_until(lambda: not _alive(watchdog), 5, "the watchdog to exit")


@needs_proc
@pytest.mark.timeout(60)
def test_a_watchdog_told_bye_kills_nothing():
    driver = subprocess.Popen([sys.executable, "-c", FAKE_DRIVER, "bye"], stdout=subprocess.PIPE, text=True)
    try:
        watchdog, _, worker = map(int, driver.stdout.readline().split())
        assert driver.stdout.readline().strip() == "closed"
        assert not _alive(watchdog)
        assert _alive(worker)  # orphaned by the test's own kill of its parent, not killed by the watchdog
    finally:
        driver.kill()
        driver.wait()
        os.kill(worker, signal.SIGKILL)


# -- the heartbeat on the shared cluster ----------------------------------------------------------------


@needs_proc
@pytest.mark.timeout(400)  # the shared cluster's start-up counts when this test is the first to use it
def test_a_stopped_actor_is_named_after_the_worker_timeout(ray_cluster, capsys):
    import ray

    @ray.remote(num_cpus=0)
    class Busy:
        def work(self, seconds):
            time.sleep(seconds)
            return seconds

    actor = Busy.remote()
    beats = heartbeat.Heartbeats(timeout=6)
    ((pid, ip, init_done),) = waits.get(beats.install([("rollout worker 3", actor)]), "start-up", timeout=60)
    assert abs(init_done - time.time()) < 60
    beats.started([(pid, ip)])
    (worker,) = beats.workers
    assert worker.pid and worker.pid != os.getpid()
    waits.watch_heartbeats(beats)
    try:
        assert waits.get(actor.work.remote(0.1), "rollout", timeout=60) == 0.1  # beating: no alarm
        assert beats.silent() == []
        call = actor.work.remote(30)
        time.sleep(1.5)  # inside work()
        os.kill(worker.pid, signal.SIGSTOP)
        started = time.monotonic()
        with pytest.raises(waits.WorkerUnresponsive) as caught:
            waits.get(call, "rollout")
        took = time.monotonic() - started
        message = str(caught.value)
        assert message.startswith(f"the rollout worker 3 (pid {worker.pid} on ") and " stopped responding: " in message
        assert "died" not in message.split(".")[0]
        assert "--worker-timeout 6" in message and "state T: SIGSTOP" in message
        assert "Busy.work (" in message and "test_heartbeat.py:" in message  # where it was
        assert 5 <= took <= 20, took
        err = capsys.readouterr().err
        assert f"relax: still waiting for the rollout: the rollout worker 3 (pid {worker.pid}" in err
        assert beats.silent_pids_on_this_machine() == [worker.pid]
        assert reaper.kill_pids([worker.pid]) == [worker.pid]
        _wait_until(lambda: not _alive(worker.pid), 10, "the stopped worker to die")
        from ray.experimental import internal_kv

        assert internal_kv._internal_kv_get(worker.key, namespace=heartbeat.NAMESPACE) is not None
        beats.forget()  # a kept cluster keeps no beats of a finished run
        assert internal_kv._internal_kv_get(worker.key, namespace=heartbeat.NAMESPACE) is None
    finally:
        waits.watch_heartbeats(None)
        ray.kill(actor)


# -- relax train ----------------------------------------------------------------------------------------

RUN_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled",
           "TQ_NUM_THREADS": "2", "HF_HUB_OFFLINE": "1"}
TINY = ["--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--no-progress", "--no-eval"]


def _children_named(root: int, prefix: str) -> list[int]:
    return [p for p in reaper.descendants(root) if _cmdline(p).startswith(prefix)]


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _start_run(tmp_path: Path, *argv) -> tuple[subprocess.Popen, dict]:
    env = {**RUN_ENV, "RAY_TMPDIR": tempfile.mkdtemp(prefix="rh_", dir="/tmp")}  # this run's own Ray
    relax = shutil.which("relax", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    assert relax, "the relax console script is not installed"
    run = subprocess.Popen([relax, "train", *TINY, *argv, "--output-dir", "run"], cwd=tmp_path, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return run, env


def _rows(tmp_path: Path) -> int:
    path = tmp_path / "run" / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


@needs_proc
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_stopped_rollout_worker_ends_the_run_with_a_line_naming_it(tmp_path):
    run, _ = _start_run(tmp_path, "--num-rollout", "400", "--seed", "7", "--worker-timeout", "8")
    try:
        _wait_until(lambda: _rows(tmp_path) >= 2 or run.poll() is not None, 600, "two trained steps")
        assert run.poll() is None, run.communicate()[1]
        (rollout,) = _children_named(run.pid, "ray::RolloutWorker")
        ray_processes = reaper.descendants(run.pid)  # every Ray process of the run, before the stop
        os.kill(rollout, signal.SIGSTOP)
        stopped = time.monotonic()
        _, err = run.communicate(timeout=120)
        took = time.monotonic() - stopped
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 1, err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"relax train: error: the rollout worker 0 (pid {rollout} on "), err
    assert "stopped responding: no heartbeat for " in last and "state T: SIGSTOP" in last and "died" not in last
    assert f"relax: still waiting for the rollout: the rollout worker 0 (pid {rollout}" in err
    assert took < 90, f"the run took {took:.0f}s to end after the stop"
    time.sleep(1)
    left = [f"{p} {_cmdline(p)}" for p in ray_processes if _alive(p)]
    assert not left, f"Ray processes of the run still alive: {left}"


@needs_proc
@pytest.mark.slow
@pytest.mark.timeout(720)
def test_no_ray_process_survives_a_killed_driver(tmp_path):
    run, _ = _start_run(tmp_path, "--num-rollout", "400")

    def workers_up() -> bool:
        names = [_cmdline(p) for p in reaper.descendants(run.pid)]
        return run.poll() is not None or all(any(n.startswith(w) for n in names) for w in
                                              ("ray::RolloutWorker", "ray::ActorWorker", "ray::TransferQueueController"))

    try:
        _wait_until(workers_up, 600, "the run's workers and TransferQueue")
        assert run.poll() is None, run.communicate()[1]
        ray_processes = reaper.descendants(run.pid)
        time.sleep(1.5)  # the watchdog's note is at most a second old
        run.kill()
        run.wait()
    finally:
        if run.poll() is None:
            run.kill()
    _wait_until(lambda: not any(_alive(p) for p in ray_processes), 30, "every Ray process of the run to end")


@needs_proc
@pytest.mark.slow
@pytest.mark.timeout(720)
def test_sigterm_during_ray_start_up_exits_143_and_leaves_no_ray_process(tmp_path):
    run, _ = _start_run(tmp_path, "--num-rollout", "3")
    seen: dict[int, int] = {}
    try:
        def ray_is_starting() -> bool:
            seen.update(reaper.descendants(run.pid))
            return any("gcs_server" in _cmdline(p) for p in seen) or run.poll() is not None

        _wait_until(ray_is_starting, 600, "Ray's start-up (its gcs_server)")
        assert run.poll() is None, run.communicate()[1]
        run.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 120
        while run.poll() is None and time.monotonic() < deadline:
            seen.update(reaper.descendants(run.pid))  # what the start-up started meanwhile
            time.sleep(0.2)
        _, err = run.communicate(timeout=10)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 143, err
    assert "relax train: terminated (SIGTERM)" in err
    time.sleep(1)
    left = [f"{p} {_cmdline(p)}" for p in seen if _alive(p)]
    assert not left, f"Ray processes of the run still alive: {left}"


def test_a_step_without_progress_names_where_the_workers_are_and_the_user_code_deadlines(monkeypatch):
    class Beats:  # a run's heartbeats whose rollout worker sits in a user's environment step
        def still_waiting_lines(self, waiting_for):
            return []

        def unresponsive(self):
            return None

        def places(self):
            return "rollout worker 0 in HangingEnv.step (my_envs.py:7); actor rank 0 in idle (between calls)"

    monkeypatch.setattr(waits, "_HEARTBEATS", [Beats()])
    with pytest.raises(waits.WorkerUnresponsive) as caught:
        waits._check_progress("rollout", (time.monotonic() - 30, 20.0, 0.5), [])
    message = str(caught.value)
    assert "the workers are at: rollout worker 0 in HangingEnv.step (my_envs.py:7)" in message
    assert "bounded by --env-timeout, --reward-timeout and --hook-timeout" in message
