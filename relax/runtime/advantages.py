"""The advantages role: a Ray Serve deployment that instantiates the algorithm from its spec string
and calls ``compute_advantages`` on the whole step, one segment per optimizer mini-batch.

``AdvantagesCore`` is plain Python (unit-testable without Ray); ``AdvantagesDeployment`` wraps it
for Serve. Settings follow docs/en/ray-and-transferqueue.md#serve-settings: a fractional CPU, no HTTP
proxy (the runtime calls it through a handle), access logs off, fast graceful shutdown.
"""

from __future__ import annotations

import time

import torch

from relax.algorithms import AdvantageInputs, load_algorithm
from relax.algorithms.types import check_advantages_output

APP_NAME = "relax_advantages"
KEPT_APP_PREFIX = "relax_advantages_kept_"  # + the relax code fingerprint (relax.runtime.worker_pool)
# both deployments': a fractional CPU, room for queued steps, a fast graceful shutdown
DEPLOYMENT_OPTIONS = {"ray_actor_options": {"num_cpus": 0.25}, "max_ongoing_requests": 64,
                      "graceful_shutdown_wait_loop_s": 0.1, "graceful_shutdown_timeout_s": 0.5,
                      "health_check_period_s": 10}


class AdvantagesCore:
    def __init__(self, algorithm_spec: str, algorithm_config, data_plane=None):
        torch.set_num_threads(1)
        self.algorithm = load_algorithm(algorithm_spec)(algorithm_config)
        self.data_plane = data_plane

    def compute(self, step: int, num_groups: int, segment_sizes: tuple[int, ...], with_values: bool,
                with_kl: bool, group_uids: list[int] | None = None) -> dict:
        """Read rewards/masks (and values, KL) of the step, write ``advantages`` and ``returns``.

        ``group_uids``: the groups in mini-batch order (``StepPlan.uids``); None reads them in write
        order, which is the plan's order only with a single rollout worker."""
        t0 = time.perf_counter()
        fields = ("rewards", "response_mask") + (("values",) if with_values else ()) + (("kl",) if with_kl else ())
        read = self.data_plane.read(step, fields, "advantages", num_groups, group_uids)
        t1 = time.perf_counter()
        inputs = AdvantageInputs(
            rewards=read["rewards"].float(),
            response_mask=read["response_mask"].bool(),
            values=read["values"].float() if with_values else None,
            kl=read["kl"].float() if with_kl else None,
            segment_sizes=tuple(segment_sizes),
        )
        output = self.algorithm.compute_advantages(inputs)
        check_advantages_output(self.algorithm, output, inputs.response_mask.shape, step=step)
        advantages, returns = output
        self.data_plane.add_fields(read, {"advantages": advantages.float(), "returns": returns.float()})
        mask = inputs.response_mask
        valid = advantages[mask]
        return {
            "advantages/mean": float(valid.mean()) if valid.numel() else 0.0,
            "advantages/std": float(valid.std(unbiased=False)) if valid.numel() else 0.0,
            "time/advantages/read_s": t1 - t0,
            "time/advantages/total_s": time.perf_counter() - t0,
        }


def make_deployment():
    """The Serve deployment class (built lazily so importing this module does not import Serve)."""
    from ray import serve

    @serve.deployment(name="advantages", **DEPLOYMENT_OPTIONS)
    class AdvantagesDeployment:
        def __init__(self, algorithm_spec: str, algorithm_config, run_prefix: str | None = None):
            if run_prefix is not None:
                # the run's data-plane partitions (relax.runtime.data_plane): Serve builds a replica's
                # environment itself, so the driver hands the prefix over rather than trusting the job's
                import os

                from relax.runtime.ray_session import RUN_PREFIX_ENV

                os.environ[RUN_PREFIX_ENV] = run_prefix
            self.core = AdvantagesCore(algorithm_spec, algorithm_config)

        def compute(self, step, num_groups, segment_sizes, with_values, with_kl, group_uids=None) -> dict:
            if self.core.data_plane is None:
                # Attach on first use, not in __init__: the driver starts TransferQueue while Serve
                # brings this replica up, so neither waits for the other.
                from relax.runtime.data_plane import TransferQueueDataPlane

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
            from relax.runtime.data_plane import TransferQueueDataPlane

            plane = TransferQueueDataPlane(run_prefix=run_prefix).attach()
            self.cores[run_prefix] = AdvantagesCore(algorithm_spec, algorithm_config, plane)
            return True

        def close(self, run_prefix: str) -> bool:
            return self.cores.pop(run_prefix, None) is not None

        def compute(self, step, num_groups, segment_sizes, with_values, with_kl, group_uids=None, *,
                    run: str) -> dict:
            return self.cores[run].compute(step, num_groups, segment_sizes, with_values, with_kl, group_uids)

    return KeptAdvantagesDeployment
