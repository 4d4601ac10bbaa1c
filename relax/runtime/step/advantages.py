"""The advantages role: a Ray Serve deployment that instantiates the algorithm from its spec string
and calls ``compute_advantages`` on the whole step, one segment per optimizer mini-batch.

``AdvantagesCore`` is plain Python (unit-testable without Ray); the Serve deployments that wrap it
are ``relax.runtime.session.deployments``.
"""

from __future__ import annotations

import time

import torch

from relax.algorithms import AdvantageInputs, load_algorithm
from relax.algorithms.types import check_advantages_output


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


