"""The kept cluster's shared advantages deployment, from the driver's side.

A run on a kept cluster with pre-started workers (``relax cluster up``) does not deploy a Serve app
of its own for a built-in method: it opens itself on the cluster's kept app (one per relax code
version, deployed by the first run that needs it) and closes itself at its end. A user's method
(``module:Class``) still gets an app of its own, so that an edited module is imported afresh.
"""

from __future__ import annotations

from relax.algorithms.registry import is_dotted_path


def shares_kept_app(algorithm_spec: str) -> bool:
    return not is_dotted_path(algorithm_spec)


def _app_name() -> str:
    """One kept app per relax code version (a replica imports relax once)."""
    from relax.runtime.cluster.worker_pool import code_fingerprint
    from relax.runtime.session.deployments import KEPT_APP_PREFIX

    return KEPT_APP_PREFIX + code_fingerprint()


def deploy(quiet: dict):
    """Deploy the kept app of this relax code (``relax cluster up``, or the first run that needs
    it), deleting those of older code; returns its handle."""
    from ray import serve

    from relax.runtime.session.deployments import KEPT_APP_PREFIX, make_kept_deployment

    name = _app_name()
    for stale in serve.status().applications:
        if stale.startswith(KEPT_APP_PREFIX) and stale != name:
            serve.delete(stale, _blocking=False)
    return serve.run(make_kept_deployment().bind(), name=name, route_prefix=None, logging_config=quiet)


def open_run(algorithm_spec: str, algorithm_config, run_prefix: str, quiet: dict):
    """The kept app's handle, with this run opened on it (deployed first when it is not up)."""
    from ray import serve

    try:
        handle = serve.get_app_handle(_app_name())
    except Exception:  # noqa: BLE001 - Serve raises RayServeException (or KeyError) for an unknown app
        handle = deploy(quiet)
    handle.open.remote(run_prefix, algorithm_spec, algorithm_config).result()
    return handle


def close_run(handle, run_prefix: str) -> None:
    handle.close.remote(run_prefix).result()
