"""The Ray Serve deployments around the advantages role (``relax.runtime.step.advantages.AdvantagesCore``):
one per run, and the kept cluster's one that serves every run on it. Built lazily, so importing this
module does not import Serve. Settings follow docs/en/ray-and-transferqueue.md#serve-settings: a
fractional CPU, no HTTP proxy (the runtime calls it through a handle), access logs off, fast graceful
shutdown."""

from __future__ import annotations

from relax.runtime.step.advantages import AdvantagesCore

APP_NAME = "relax_advantages"
KEPT_APP_PREFIX = "relax_advantages_kept_"  # + the relax code fingerprint (relax.runtime.cluster.worker_pool)


# both deployments': a fractional CPU, room for queued steps, a fast graceful shutdown
DEPLOYMENT_OPTIONS = {"ray_actor_options": {"num_cpus": 0.25}, "max_ongoing_requests": 64,
                      "graceful_shutdown_wait_loop_s": 0.1, "graceful_shutdown_timeout_s": 0.5,
                      "health_check_period_s": 10}


def make_deployment():
    """The Serve deployment class (built lazily so importing this module does not import Serve)."""
    from ray import serve

    @serve.deployment(name="advantages", **DEPLOYMENT_OPTIONS)
    class AdvantagesDeployment:
        def __init__(self, algorithm_spec: str, algorithm_config, run_prefix: str | None = None):
            if run_prefix is not None:
                # the run's data-plane partitions (relax.runtime.data.data_plane): Serve builds a replica's
                # environment itself, so the driver hands the prefix over rather than trusting the job's
                import os

                from relax.runtime.data.data_plane import RUN_PREFIX_ENV

                os.environ[RUN_PREFIX_ENV] = run_prefix
            self.core = AdvantagesCore(algorithm_spec, algorithm_config)

        def compute(self, step, num_groups, segment_sizes, with_values, with_kl, group_uids=None) -> dict:
            if self.core.data_plane is None:
                # Attach on first use, not in __init__: the driver starts TransferQueue while Serve
                # brings this replica up, so neither waits for the other.
                from relax.runtime.data.data_plane import TransferQueueDataPlane

                self.core.data_plane = TransferQueueDataPlane().attach()
            return self.core.compute(step, num_groups, segment_sizes, with_values, with_kl, group_uids)

    return AdvantagesDeployment


def make_kept_deployment():
    """The kept cluster's advantages deployment (``relax cluster up``): one replica that serves every
    run on the cluster, so a run does not wait for a replica process of its own. A run ``open``s its
    algorithm (a built-in: a user's module would stay imported in the replica as it was at the first
    run) and names itself (its data-plane prefix) in every call."""
    from ray import serve

    @serve.deployment(name="advantages_kept", **DEPLOYMENT_OPTIONS)
    class KeptAdvantagesDeployment:
        def __init__(self):
            self.cores: dict[str, AdvantagesCore] = {}

        def open(self, run_prefix: str, algorithm_spec: str, algorithm_config) -> bool:
            from relax.runtime.data.data_plane import TransferQueueDataPlane

            plane = TransferQueueDataPlane(run_prefix=run_prefix).attach()
            self.cores[run_prefix] = AdvantagesCore(algorithm_spec, algorithm_config, plane)
            return True

        def close(self, run_prefix: str) -> bool:
            return self.cores.pop(run_prefix, None) is not None

        def compute(self, step, num_groups, segment_sizes, with_values, with_kl, group_uids=None, *,
                    run: str) -> dict:
            return self.cores[run].compute(step, num_groups, segment_sizes, with_values, with_kl, group_uids)

    return KeptAdvantagesDeployment
