"""``relax.rewards.code:score``: run the completion's Python code against tests, in a sandbox.

Use it with ``--custom-rm-path relax.rewards.code:score --reward-keys passed`` (``runs`` is there for
logging or as a second component). The program is the last fenced Python block of the completion
(```` ```python ```` or a bare ```` ``` ````); ``metadata["tests"]`` is a list of tests of two kinds:

- a string: Python statements run after the program in the same namespace, passing when they raise
  nothing (e.g. ``"assert add(2, 3) == 5"``);
- ``{"input": str, "output": str}``: the program is run with that standard input and passes when its
  standard output equals ``output`` (trailing whitespace of each line and the end ignored).

Components: ``passed`` = share of tests that passed; ``runs`` = 1.0 when the program itself ran to
the end without an error (the first run, before any test) and within its limits. A completion without
a code block scores 0 for both. Every run happens in ``relax.rewards.sandbox`` (no network, writes
only to a scratch directory, an unprivileged user when relax is root, CPU/memory/time limits): an
endless loop is killed at its CPU or wall-clock limit and scores 0.

In the statement kind the tests run in the program's own process, so a program written to defeat
them (e.g. one that replaces ``AssertionError`` or exits the interpreter with status 0 early) can fool
its score: the sandbox protects the machine, not the score. The input/output kind compares in relax's
process and cannot be faked this way.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from relax.rewards.sandbox import SandboxLimits, default_interpreter, run_sandboxed

REWARD_KEYS = ("passed", "runs")
DEFAULT_LIMITS = SandboxLimits()

_BLOCK_RE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)

# Runs inside the sandbox: the program, then each statement test, each verdict a JSON line on fd 3.
_HARNESS = """\
import json, os, traceback
verdicts = os.fdopen(3, "w", buffering=1)
namespace = {"__name__": "__main__"}
try:
    exec(compile(open("solution.py").read(), "solution.py", "exec"), namespace)
except BaseException:
    traceback.print_exc()
    verdicts.write(json.dumps({"program": False}) + "\\n")
    raise SystemExit(0)
verdicts.write(json.dumps({"program": True}) + "\\n")
for i, test in enumerate(json.load(open("tests.json"))):
    try:
        exec(compile(test, f"test_{i}", "exec"), namespace)
        ok = True
    except BaseException:
        ok = False
    verdicts.write(json.dumps({"test": i, "ok": ok}) + "\\n")
"""


def extract_program(completion: str) -> str | None:
    """The last fenced Python (or unlabelled) code block of ``completion``, or ``None``."""
    blocks = _BLOCK_RE.findall(completion)
    return blocks[-1] if blocks else None


def _check_tests(tests: Any) -> list:
    if not isinstance(tests, Sequence) or isinstance(tests, str):
        raise ValueError(
            f"relax.rewards.code: metadata['tests'] must be a list of tests, got {type(tests).__name__}; "
            "each test is a Python statement string or {'input': ..., 'output': ...}"
        )
    for i, test in enumerate(tests):
        ok = isinstance(test, str) or (
            isinstance(test, Mapping) and isinstance(test.get("input", ""), str)
            and isinstance(test.get("output"), str))
        if not ok:
            raise ValueError(
                f"relax.rewards.code: metadata['tests'][{i}] = {test!r:.80} is neither a Python statement "
                "string nor a mapping with string 'input' and 'output'"
            )
    return list(tests)


def _same_output(got: str, expected: str) -> bool:
    def norm(text: str) -> list[str]:
        return [line.rstrip() for line in text.rstrip().splitlines()]

    return norm(got) == norm(expected)


def _run_statement_tests(program: str, tests: list[str], interpreter: str, limits: SandboxLimits):
    files = {"solution.py": program, "tests.json": json.dumps(tests), "harness.py": _HARNESS}
    # The verdicts go to the sandbox's stdout, moved to fd 3; the program's own prints go to stderr.
    boot = "import os; os.dup2(1, 3); os.dup2(2, 1); exec(open('harness.py').read())"
    argv = [interpreter, "-I", "-S", "-c", boot]
    result = run_sandboxed(files, argv, limits)
    program_ok, passed = False, set()
    for line in result.stdout.splitlines():
        try:
            verdict = json.loads(line)
        except ValueError:
            continue
        if isinstance(verdict, dict):
            program_ok = program_ok or verdict.get("program") is True
            if verdict.get("ok") is True and isinstance(verdict.get("test"), int):
                passed.add(verdict["test"])
    if not result.ok:  # killed at a limit (e.g. an endless loop in a test): what finished still counts
        program_ok = program_ok and not result.timed_out and result.returncode >= 0
    return program_ok, len(passed & set(range(len(tests))))


def _run_io_tests(program: str, tests: list[Mapping], interpreter: str, limits: SandboxLimits):
    argv = [interpreter, "-I", "-S", "solution.py"]
    passed, runs = 0, True
    for test in tests:
        result = run_sandboxed({"solution.py": program}, argv, limits, stdin=test.get("input", ""))
        runs = runs and result.ok
        passed += result.ok and _same_output(result.stdout, test["output"])
    return runs, passed


def run_tests(program: str, tests: Sequence, *, limits: SandboxLimits = DEFAULT_LIMITS,
              interpreter: str | None = None) -> dict[str, float]:
    """``{"passed": share of tests passed, "runs": 1.0 if the program ran without error}``."""
    tests = _check_tests(tests)
    interpreter = interpreter or default_interpreter()
    statements = [t for t in tests if isinstance(t, str)]
    io_tests = [t for t in tests if not isinstance(t, str)]
    runs, passed = True, 0
    if statements or not io_tests:
        ok, n = _run_statement_tests(program, statements, interpreter, limits)
        runs, passed = runs and ok, passed + n
    if io_tests:
        ok, n = _run_io_tests(program, io_tests, interpreter, limits)
        runs, passed = runs and ok, passed + n
    return {"passed": passed / len(tests) if tests else float(runs), "runs": float(runs)}


def make_score(*, limits: SandboxLimits = DEFAULT_LIMITS, interpreter: str | None = None):
    """A ``score`` with other sandbox limits, e.g. ``make_score(limits=SandboxLimits(cpu_seconds=2))``."""

    def score(prompt: str, completion: str, label: Any, metadata: Mapping) -> dict[str, float]:
        program = extract_program(completion)
        tests = (metadata or {}).get("tests")
        if tests is None:
            raise ValueError(
                "relax.rewards.code:score needs metadata['tests'] (a list of tests) for every sample; "
                "put a 'tests' field in the prompt data's metadata (see --metadata-key)"
            )
        if program is None:
            _check_tests(tests)
            return {"passed": 0.0, "runs": 0.0}
        return run_tests(program, tests, limits=limits, interpreter=interpreter)

    score.__qualname__ = score.__name__ = "score"
    return score


score = make_score()
