"""Session-wide fixtures: ONE local Ray cluster (with Serve and TransferQueue) for the whole run.

Starting Ray, TransferQueue and Serve costs 10-30 s on a busy 2-core machine, so every test marked
``ray`` shares the cluster that ``ray_cluster`` starts on first use and stops at the end of the
session (see docs/en/ray-and-transferqueue.md#test-cluster). Tests that never request it never start it.

``ray_cluster`` yields a directory on the workers' PYTHONPATH: a test writes a user module there
(e.g. an ``RLAlgorithm`` subclass for ``--advantage-estimator my_mod:MyAlgo``) and every Ray worker
started afterwards can import it.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import warnings
from pathlib import Path

import pytest

RAY_ENV = {
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_DEDUP_LOGS": "0",
    "TQ_NUM_THREADS": "2",
    "OMP_NUM_THREADS": "1",
}


@pytest.fixture(scope="session")
def ray_cluster():
    for k, v in RAY_ENV.items():
        os.environ.setdefault(k, v)
    if "RAY_TMPDIR" not in os.environ:
        # Short and private: unix socket paths are limited, and other users' clusters must not collide.
        os.environ["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="rr_", dir="/tmp")
    user_dir = Path(tempfile.mkdtemp(prefix="relax_user_modules_"))
    warnings.filterwarnings("ignore", module="pydantic")
    import ray

    from relax.runtime.data import lazy_dynamo
    from relax.runtime.data.data_plane import TransferQueueDataPlane

    paths = [str(user_dir)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = {**{k: os.environ[k] for k in RAY_ENV}, "PYTHONPATH": os.pathsep.join(paths)}
    ray.init(
        num_cpus=6,
        include_dashboard=False,
        object_store_memory=256 * 2**20,
        log_to_driver=False,
        runtime_env={"env_vars": env, "worker_process_setup_hook": lazy_dynamo.HOOK},
    )
    data_plane = TransferQueueDataPlane().start()
    try:
        yield user_dir
    finally:
        with contextlib.suppress(Exception):  # nothing to shut down when no test deployed an app
            from ray import serve

            serve.shutdown()
        data_plane.close()
        ray.shutdown()
