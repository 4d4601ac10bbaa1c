"""Ray's relayed lines that are noise on a normal run are dropped: Serve's scheduling warning of a
slow start-up, its shutdown chatter, TransferQueue's already-dropped partitions (relax's own waits
name a replica or worker that never starts)."""

from __future__ import annotations

import logging

from relax.runtime.session.ray_session import RELAYED_NOISE, _DropNoise

SERVE_SCHEDULING = (
    "WARNING 2026-12-01 21:11:40,409 controller 32547 -- Deployment 'advantages' in application "
    "'relax_advantages' has 1 replicas that have taken more than 30s to be scheduled. This may be due to "
    "waiting for the cluster to auto-scale or for a runtime environment to be installed."
)


def _passes(message: str) -> bool:
    return _DropNoise().filter(logging.LogRecord("ray.serve", logging.WARNING, __file__, 1, message, None, None))


def test_serve_scheduling_warning_is_dropped_and_real_warnings_are_kept():
    assert not _passes(SERVE_SCHEDULING)
    assert not _passes("Task failed: killed by `ray.kill`")
    assert _passes("relax: warning: step 3 trained nothing")
    assert len(RELAYED_NOISE) == len(set(RELAYED_NOISE))
