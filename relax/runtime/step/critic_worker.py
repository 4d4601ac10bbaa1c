"""The critic role (methods with ``needs_critic``, e.g. PPO): one Ray actor with the value model.

It reads the whole step, writes the ``values`` field the advantages need, then trains on the
``returns`` of the advantages role with the clipped value loss. The value model is the policy's
trunk with a scalar head (``relax.models.value``) and it trains through a training backend like the
actor does: ``--backend``'s own when that backend has a value head, else the torch backend (the
critic is one process, so it needs no model parallelism).
"""

from __future__ import annotations

import time

import torch

from relax.algorithms import PolicyLossOutput, numerics
from relax.backends import token_budget
from relax.backends.registry import get_critic_backend
from relax.config.steps import num_minibatches
from relax.models.factory import build_policy_model
from relax.models.value import ValueModel
from relax.rollout.environments import is_multi_turn
from relax.runtime.step.fields import AttachesDataPlane, batch_fields, to_device, token_batch
from relax.runtime.step.rollouts import plan_from_rollouts
from relax.runtime.step.schedule import StepPlan, segment_slices


class CriticCore:
    def __init__(self, config, data_plane=None):
        torch.set_num_threads(1)
        self.config = config
        self.model = ValueModel(build_policy_model(config))
        self.backend = get_critic_backend(config.backend).for_critic(config, self.model)
        self.data_plane = data_plane
        self.num_minibatches = num_minibatches(config)
        self._cache = None

    def values(self, step: int, plan: StepPlan) -> dict:
        t0 = time.perf_counter()
        read = self.data_plane.read(step, batch_fields(is_multi_turn(self.config)), "critic", plan.num_groups,
                                    plan.uids)
        batch = token_batch(to_device(read.fields, self.backend.device))  # the data plane's CPU tensors
        # --max-tokens-per-micro-batch: padded micro-batches of at most that many tokens (else the whole step)
        budget_rows = token_budget.padded_rows_within(self.config.max_tokens_per_micro_batch, batch)
        values = self.backend.compute_values(batch, micro_batch_size=budget_rows)
        self.data_plane.add_fields(read, {"values": values.cpu()})
        self._cache = {"step": step, "batch": batch, "values": values}
        return {"time/critic/values_s": time.perf_counter() - t0}

    def train(self, step: int, plan: StepPlan) -> dict:
        t0 = time.perf_counter()
        cache, self._cache = self._cache, None
        if cache is None or cache["step"] != step:
            raise RuntimeError(f"critic.train({step}) without critic.values({step}) first")
        returns = self.data_plane.read(step, ("returns",), "critic_returns", plan.num_groups, plan.uids)["returns"]
        returns = returns.to(self.backend.device, non_blocking=True).float()
        batch, old_values = cache["batch"], cache["values"]
        parts = []
        for j, rows in enumerate(segment_slices(plan.segment_sizes)):
            sub = batch.select(rows)
            tokens = float(plan.global_tokens[j]) or 1.0  # 0 (--overlong-filter): a zero loss, not 0 / 0

            def loss_fn(out, micro: slice, rows=rows, sub=sub, tokens=tokens):
                loss, clipfrac = numerics.value_loss(
                    out.values, old_values[rows][micro], returns[rows][micro], sub.response_mask[micro],
                    self.config.value_clip, "token_mean", global_num_tokens=tokens,
                )
                return PolicyLossOutput(loss=loss, metrics={"value_clipfrac": clipfrac})

            m = self.backend.train_step(sub, loss_fn, micro_batch_size=self.config.micro_batch_size,
                                        with_entropy=False)
            parts.append({"value_loss": m["loss"], "value_clipfrac": m["value_clipfrac"], "grad_norm": m["grad_norm"]})
        metrics = {f"critic/{k}": sum(p[k] for p in parts) / len(parts) for k in parts[0]}
        metrics["time/critic/train_s"] = time.perf_counter() - t0
        return metrics

    def state_dict(self) -> dict:
        return self.backend.state_dict()

    def load_state_dict(self, state) -> bool:
        # Critic checkpoints from before the critic trained through a backend carry no step counter.
        self.backend.load_state_dict({"step": 0, **state})
        return True


class CriticWorker(AttachesDataPlane, CriticCore):
    """Ray actor of the critic (takes the rollout's result, like ``ActorWorker``)."""

    def values_step(self, step: int, *rolls: dict) -> dict:
        plan = plan_from_rollouts(rolls, self.num_minibatches, 1)
        return self.values(step, plan) if plan.num_groups else {}

    def train_step(self, step: int, *rolls: dict) -> dict:
        plan = plan_from_rollouts(rolls, self.num_minibatches, 1)
        return self.train(step, plan) if plan.num_groups else {}
