"""No process a sandboxed program starts outlives ``run_sandboxed`` / ``relax.rewards.code:score``.

Every escapee here execs ``sleep <token>`` with a token unique to the test, so that the check after the
return ("no process on the machine has that command line") cannot confuse it with anything else.
"""

from __future__ import annotations

import ast
import sys
import time
import uuid
from pathlib import Path

import pytest

from relax.rewards import code
from relax.rewards.sandbox import SandboxLimits, default_interpreter, run_sandboxed

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox needs Linux")

FAST = SandboxLimits(cpu_seconds=2, wall_seconds=8.0)


def token() -> str:
    return f"{40000 + uuid.uuid4().int % 50000}.{uuid.uuid4().int % 10**9:09d}"  # seconds, as `sleep` reads them


def survivors(mark: str) -> list[int]:
    """Pids of live processes (zombies aside) whose command line is ``sleep <mark>``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if argv[:2] == [b"sleep", mark.encode()] and state != "Z":
            found.append(int(entry.name))
    return found


def run(source: str, limits: SandboxLimits = FAST):
    return run_sandboxed({"main.py": source}, [default_interpreter(), "-I", "-S", "main.py"], limits)


def test_the_issue_reproduction_double_fork_setsid_exec_does_not_outlive_score():
    mark = token()
    program = (f'```python\nimport os\nif os.fork() == 0:\n    os.setsid(); os.execvp("sleep", ["sleep", "{mark}"])\n'
               "import time\ntime.sleep(0.3)\n```")
    assert code.score("", program, None, {"tests": []}) == {"passed": 1.0, "runs": 1.0}
    assert survivors(mark) == []


def test_a_daemon_is_killed_with_the_program():
    mark = token()
    daemon = f"""
import os, signal, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:                      # the classic double fork: no session leader, no parent
        os.chdir("/")
        os.umask(0)
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
        fd = os.open(os.devnull, os.O_RDWR)
        for std in (0, 1, 2):
            os.dup2(fd, std)
        os.execvp("sleep", ["sleep", "{mark}"])
    os._exit(0)
os.wait()
time.sleep(0.3)                              # the daemon is up when the program ends
print("started")
"""
    result = run(daemon)
    assert result.ok and result.stdout.strip() == "started", result.stderr
    assert survivors(mark) == []


def test_a_bounded_fork_bomb_is_killed_with_the_program():
    # Every process forks until RLIMIT_NPROC (24 here) refuses, records itself in the scratch
    # directory, leaves the process group and becomes `sleep <mark>`; the program counts the records and ends.
    mark = token()
    bomb = f"""
import os, time
if os.fork() == 0:
    for _ in range(64):
        try:
            os.fork()
        except OSError:
            break
    open(f"alive-{{os.getpid()}}", "w").close()
    os.setsid()                              # out of the program's process group
    os.execvp("sleep", ["sleep", "{mark}"])
time.sleep(1.0)
print(sum(name.startswith("alive-") for name in os.listdir(".")))
"""
    result = run(bomb, SandboxLimits(cpu_seconds=2, wall_seconds=8.0, processes=24))
    assert result.ok, result.stderr
    assert int(result.stdout) >= 2  # the bomb did multiply before the limit stopped it
    assert survivors(mark) == []


def test_escapees_end_at_the_wall_clock_timeout_too():
    mark = token()
    hang = (f'import os, time\nif os.fork() == 0:\n    os.setsid(); os.execvp("sleep", ["sleep", "{mark}"])\n'
            "time.sleep(60)")
    start = time.monotonic()
    result = run(hang, SandboxLimits(cpu_seconds=1, wall_seconds=1.5))
    assert result.timed_out and time.monotonic() - start < 10
    assert survivors(mark) == []


def test_the_program_sees_only_its_own_processes_and_its_exit_is_relayed():
    result = run("import os\nprint(os.getpid(), os.getppid())\nraise SystemExit(7)")
    assert result.returncode == 7
    assert result.stdout.split() == ["2", "1"]  # process 2 of its namespace, under the boot's init
    killed = run("import os, signal\nos.kill(os.getpid(), signal.SIGUSR1)")
    assert killed.returncode == -10 and not killed.timed_out  # SIGUSR1 relayed as a signal


def test_its_proc_lists_only_the_namespace_where_the_kernel_allows_it():
    result = run("import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))")
    assert result.ok, result.stderr
    pids = ast.literal_eval(result.stdout)
    if len(pids) > 2:
        pytest.skip("this kernel/container forbids a new /proc mount; the sandbox keeps the host's")
    assert pids == [1, 2]  # the boot program's init and the program: nothing of the host
