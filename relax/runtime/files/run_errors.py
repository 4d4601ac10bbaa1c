"""Run-time failures the driver describes in one line (``relax train`` prints ``relax train: error:``
with the message and exits with status 1, no traceback), and the messages of steps that trained
nothing.
"""

from __future__ import annotations


class RunFailed(RuntimeError):
    """A run stopped (or finished) without what it was asked for: a checkpoint that could not be
    written, a run in which no step trained. The message names the cause and what was kept."""


def _dropped_by(config) -> str:
    if config.dynamic_sampling_filter_path:
        return f"the method's group filter or --dynamic-sampling-filter-path {config.dynamic_sampling_filter_path}"
    return "the method's group filter (a group whose samples all got the same reward carries no signal)"


def skipped_step_warning(config, row: dict) -> str:
    """The warning of a step whose every prompt group was dropped (``train/skipped``)."""
    groups = int(row.get("rollout/groups_dropped", 0))
    return (
        f"relax: warning: step {row['step']} trained nothing: all {groups} prompt groups were dropped by "
        f"{_dropped_by(config)}; the weights are unchanged"
    )


def nothing_trained(config, steps: int) -> RunFailed:
    """The error of a run none of whose ``steps`` trained."""
    return RunFailed(
        f"no step of the run trained: in all {steps} steps every prompt group was dropped by {_dropped_by(config)}, "
        "so the model equals the initial weights; check that the filter keeps groups (or that the rewards vary "
        "within a group)"
    )
