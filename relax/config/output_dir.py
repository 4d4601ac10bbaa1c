"""Where a run writes: its default name and output directory (``--run-name``, ``--output-dir``)."""

from __future__ import annotations

import re
import time
from pathlib import Path

from relax.config.run import RunConfig

DEFAULT_OUTPUT_ROOT = "outputs"


def default_run_name(algorithm_spec: str) -> str:
    """``<method>-<date>-<time>``: the registered name, or a dotted path's class name, made path-safe."""
    label = re.sub(r"[^A-Za-z0-9_.-]+", "_", algorithm_spec.rpartition(":")[2] or algorithm_spec)
    return f"{label}-{time.strftime('%Y%m%d-%H%M%S')}"


def output_dir_of(config: RunConfig) -> Path:
    """Where a run writes: ``output_dir``, else ``outputs/<run_name>`` (named now when unset).

    ``relax train`` always fills in both; a config built in Python may leave them unset, and then
    each call names a new run, so call this once per run.
    """
    if config.output_dir:
        return Path(config.output_dir)
    run_name = config.run_name or default_run_name(config.advantage_estimator)
    return Path(DEFAULT_OUTPUT_ROOT) / run_name
