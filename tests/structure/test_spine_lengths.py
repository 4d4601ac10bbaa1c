"""The driver's spine stays short: ``run()`` and ``Runtime.start`` (and every phase ``run()`` was split
into, the methods of ``Run``) are each under 80 lines, so a new feature gets its own phase or module
instead of growing the one function every run goes through."""

from __future__ import annotations

import inspect

import pytest

from relax.runtime.cluster.cluster import Runtime
from relax.runtime.driver.train import Run, run

MAX_LINES = 80


def _lines(fn) -> int:
    return len(inspect.getsourcelines(fn)[0])


@pytest.mark.parametrize("fn", [run, Runtime.start], ids=["run", "Runtime.start"])
def test_the_spine_functions_are_under_80_lines(fn):
    assert _lines(fn) < MAX_LINES, (
        f"{fn.__qualname__} has {_lines(fn)} lines (limit {MAX_LINES}): split it by what it does"
    )


def test_every_phase_of_a_run_is_under_80_lines():
    phases = {name: fn for name, fn in vars(Run).items() if inspect.isfunction(fn)}
    assert {"start", "step", "finish"} <= set(phases)
    too_long = {name: _lines(fn) for name, fn in phases.items() if _lines(fn) >= MAX_LINES}
    assert not too_long, f"Run methods over {MAX_LINES} lines: {too_long}"
