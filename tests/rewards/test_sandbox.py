"""relax.rewards.sandbox and relax.rewards.code: what an untrusted program can and cannot do."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from relax.rewards import code
from relax.rewards.sandbox import SandboxLimits, default_interpreter, run_sandboxed

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox needs Linux")

FAST = SandboxLimits(cpu_seconds=2, wall_seconds=8.0)
ADD = "```python\ndef add(a, b):\n    return a + b\n```"
TESTS = {"tests": ["assert add(2, 3) == 5", "assert add(0, 0) == 0"]}


def run(source: str, limits: SandboxLimits = FAST, stdin: str = ""):
    return run_sandboxed({"main.py": source}, [default_interpreter(), "-I", "-S", "main.py"], limits, stdin)


def test_passing_failing_and_missing_code():
    assert code.score("p", ADD, None, TESTS) == {"passed": 1.0, "runs": 1.0}
    wrong = ADD.replace("a + b", "a - b")
    assert code.score("p", wrong, None, TESTS) == {"passed": 0.5, "runs": 1.0}  # only add(0, 0) holds
    assert code.score("p", "def add(a, b): return a + b", None, TESTS) == {"passed": 0.0, "runs": 0.0}
    crash = "```python\nraise SystemExit(3)\ndef add(a, b): return a + b\n```"
    assert code.score("p", crash, None, TESTS) == {"passed": 0.0, "runs": 0.0}


def test_the_last_code_block_is_the_program():
    text = "```python\ndef add(a, b): return 0\n```\nbetter:\n" + ADD
    assert code.score("p", text, None, TESTS)["passed"] == 1.0


def test_input_output_tests_compare_stdout():
    program = "```python\nprint(int(input()) * 2)\n```"
    tests = {"tests": [{"input": "3\n", "output": "6\n"}, {"input": "4", "output": "9"}]}
    assert code.score("p", program, None, tests) == {"passed": 0.5, "runs": 1.0}


def test_endless_loop_is_killed_within_the_limit_and_scores_zero():
    loop = "```python\nwhile True:\n    pass\n```"
    fast = code.make_score(limits=SandboxLimits(cpu_seconds=1, wall_seconds=4.0))
    assert fast("p", loop, None, TESTS) == {"passed": 0.0, "runs": 0.0}
    sleeper = run("import time\ntime.sleep(60)", SandboxLimits(cpu_seconds=1, wall_seconds=1.5))
    assert sleeper.timed_out and not sleeper.ok and sleeper.seconds < 10


def test_writes_outside_the_scratch_directory_fail():
    target = Path("/tmp") / f"relax-sandbox-escape-{uuid.uuid4().hex}"  # world-writable outside
    result = run(f"open({str(target)!r}, 'w').write('x')")
    assert not result.ok and "Read-only file system" in result.stderr
    assert not target.exists()
    here = Path(__file__).resolve().parent / f"escape-{uuid.uuid4().hex}"
    assert not run(f"open({str(here)!r}, 'w').write('x')").ok and not here.exists()
    program = f"```python\nopen({str(target)!r}, 'w').write('x')\ndef add(a, b): return a + b\n```"
    assert code.score("p", program, None, TESTS) == {"passed": 0.0, "runs": 0.0}
    assert not target.exists()


def test_scratch_directory_is_private_writable_and_removed():
    result = run("import os\nopen('out.txt', 'w').write('ok')\nprint(os.getcwd(), os.environ['HOME'], "
                 "os.environ['TMPDIR'], open('out.txt').read())")
    assert result.ok, result.stderr
    cwd, home, tmp, text = result.stdout.split()
    assert cwd == home == tmp and text == "ok"
    assert not Path(cwd).exists()  # deleted after the run


def test_no_network():
    result = run("import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=2)")
    assert not result.ok and "Network is unreachable" in result.stderr
    result = run("import socket\nprint(len(socket.if_nameindex()))")
    assert result.ok and result.stdout.strip() == "1"  # only the (down) loopback of its own namespace


@pytest.mark.skipif(os.geteuid() != 0, reason="the switch to nobody happens only when relax runs as root")
def test_runs_as_nobody_when_root():
    result = run("import os\nprint(os.getuid(), os.getgid(), os.getgroups())\nopen('/etc/shadow').read()")
    assert result.stdout.split("\n")[0] == "65534 65534 []"
    assert "Permission denied" in result.stderr


def test_memory_and_file_size_limits():
    big = run("x = bytearray(1 << 30)", SandboxLimits(cpu_seconds=2, wall_seconds=8, memory_bytes=256 << 20))
    assert not big.ok and "MemoryError" in big.stderr
    huge = run("open('f', 'wb').write(b'0' * (2 << 20))", SandboxLimits(cpu_seconds=2, file_bytes=1 << 20))
    assert not huge.ok  # SIGXFSZ or EFBIG


def test_bad_tests_are_a_clear_error():
    with pytest.raises(ValueError, match=r"metadata\['tests'\]"):
        code.score("p", ADD, None, {})
    with pytest.raises(ValueError, match=r"tests'\]\[1\]"):
        code.score("p", ADD, None, {"tests": ["assert True", 3]})


def test_limits_are_checked():
    with pytest.raises(ValueError, match="cpu_seconds"):
        SandboxLimits(cpu_seconds=0)


def test_as_custom_rm_path_in_reward_threads():
    from relax.rollout.rewards import load_reward_function
    from relax.rollout.rewards import score as score_batch

    fn = load_reward_function("relax.rewards.code:score")
    wrong = ADD.replace("a + b", "a - b")
    matrix = score_batch(fn, ["p"] * 3, [ADD, wrong, "no code"], [None] * 3, [TESTS] * 3, ("passed", "runs"),
                         concurrency=3)
    assert matrix.tolist() == [[1.0, 1.0], [0.5, 1.0], [0.0, 0.0]]


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("su") or not os.path.exists("/usr/bin/python3"),
                    reason="needs root and su to start the sandbox as an unprivileged user")
def test_the_unprivileged_path_isolates_through_a_user_namespace():
    # relax started by a normal user: the boot program maps that user to root in a user namespace
    # (no switch to nobody), and network and file-system isolation are the same.
    from relax.rewards.sandbox import BOOT

    scratch = tempfile.mkdtemp(prefix="relax-sandbox-user-", dir="/tmp")
    target = f"/tmp/relax-sandbox-escape-{uuid.uuid4().hex}"
    try:
        Path(scratch, "main.py").write_text(
            "import os, socket\nprint(os.getuid())\nopen('ok', 'w').write('x')\n"
            f"try:\n    open({target!r}, 'w')\nexcept OSError as e:\n    print(e.strerror)\n"
            "try:\n    socket.create_connection(('127.0.0.1', 22), timeout=1)\nexcept OSError as e:\n"
            "    print(e.strerror)\n")
        for path in (scratch, os.path.join(scratch, "main.py")):
            os.chown(path, 65534, 65534)
        config = json.dumps({"scratch": scratch, "argv": ["/usr/bin/python3", "-I", "-S", "main.py"],
                             "uid": 65534, "gid": 65534, "cpu_seconds": 5, "memory_bytes": 1 << 30,
                             "file_bytes": 1 << 20, "processes": 64})
        command = f"/usr/bin/python3 -I -S {shlex.quote(str(BOOT))} {shlex.quote(config)}"
        proc = subprocess.run(["su", "nobody", "-s", "/bin/sh", "-c", command], cwd=scratch,
                              capture_output=True, text=True, timeout=60)
        if proc.returncode == 120 and "relax sandbox:" in proc.stderr:
            pytest.skip(f"no unprivileged user namespaces here: {proc.stderr.strip()}")
        if not os.access(str(BOOT), os.R_OK) or "Permission denied" in proc.stderr:
            pytest.skip(f"nobody cannot read the checkout: {proc.stderr.strip()[:200]}")
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split("\n")[:3] == ["0", "Read-only file system", "Network is unreachable"]
        assert Path(scratch, "ok").exists() and not Path(target).exists()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def test_endless_output_is_capped_by_the_file_size_limit():
    limits = SandboxLimits(cpu_seconds=5, wall_seconds=20, file_bytes=1 << 20, output_bytes=1000)
    result = run("while True:\n    print('x' * 1000)", limits)
    assert not result.ok and not result.timed_out  # stopped by RLIMIT_FSIZE (SIGXFSZ), not the clock
    assert len(result.stdout) == 1000
