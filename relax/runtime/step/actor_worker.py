"""The actor role: one Ray actor per training rank.

Each rank reads its shard of the step from the data plane, computes the old (and, with a KL term,
reference) log-probs, gets the advantages (from the Serve deployment, or computes them itself over
its data-parallel group), and runs one optimizer step per mini-batch with ``algorithm.policy_loss``
normalized by the mini-batch's *global* token and sequence counts, so micro-batching and data
parallelism reproduce the single-process loss exactly; its metrics are shares in the same way,
summed over ranks by the driver (``relax.runtime.metrics.actor_metrics``). Rank 0 returns the new weights for
the rollout. ``ActorCore`` is plain Python; ``ActorWorker`` is the Ray actor.

The training backend comes from the registry (``--backend``); everything that differs between
backends (data-parallel identity, collective gathers) is asked of the backend, never branched on.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from relax.algorithms import AdvantageInputs, load_algorithm, numerics
from relax.algorithms.types import check_advantages_output
from relax.backends.registry import get_backend
from relax.config.steps import num_minibatches
from relax.models.batch import TokenBatch, masked_row
from relax.models.factory import build_policy_model, build_reference_model
from relax.rollout.engines import carries_behaviour_log_probs
from relax.rollout.environments import is_multi_turn
from relax.runtime.metrics.actor_metrics import (
    STEP_METRICS_KEY,
    combine_actor_metrics,
    logged_name,
    off_policy_weight_metrics,
    policy_health_shares,
)
from relax.runtime.metrics.step_metrics import gpu_peak_mib
from relax.runtime.step.fields import ATTENTION_FIELD, BATCH_FIELDS, AttachesDataPlane, to_device, token_batch
from relax.runtime.step.losses import policy_loss_fn, zero_loss
from relax.runtime.step.reference_pass import TEACHER_TIME_KEY, TeacherPass, reference_log_probs
from relax.runtime.step.rollouts import plan_from_rollouts
from relax.runtime.step.schedule import StepPlan, segment_slices, staleness_metrics
from relax.runtime.weights.weight_sync import JoinsWeightGroup, WeightSync, make_weight_sync, publish_dtype


class ActorCore:
    """One training rank. A rank's data shard is chosen by its backend's *data-parallel* rank;
    model-parallel peers (Megatron's tensor/pipeline ranks) read the same shard, and every rank
    joins every backend call."""

    def __init__(self, config, algorithm_spec: str, rank: int = 0, world_size: int = 1, *, with_reference: bool,
                 advantages_on_actor: bool, data_plane=None, with_teacher: bool = False,
                 weight_sync: WeightSync | None = None):
        torch.set_num_threads(1)
        torch.manual_seed(config.seed + rank)
        self.config = config
        self.rank, self.world_size = rank, world_size
        self.algorithm = load_algorithm(algorithm_spec)(config.algorithm)
        self.backend_cls = get_backend(config.backend)
        self.model = build_policy_model(config)
        self.reference = build_reference_model(config) if with_reference else None
        # the teacher role (a method that declares needs_teacher): scores the shard like the reference
        self.teacher = TeacherPass(config, self.model) if with_teacher else None
        self.advantages_on_actor = advantages_on_actor
        self.backend = None
        if world_size == 1:  # several ranks build theirs on the process group (init_process_group)
            self.backend = self.backend_cls.for_policy(config, self.model)
        self.data_plane = data_plane
        self.advantages_service = None  # the Serve handle; rank 0 sends it the step's request
        self.advantages_run: dict = {}  # {"run": prefix} on the kept cluster's shared deployment
        self.num_minibatches = num_minibatches(config)
        # What the rollout writes besides the tokens: its sampling log-probs when the loss corrects
        # for the behaviour policy or the engine's mismatch is logged, and each sample's policy
        # version in asynchronous runs.
        self.sample_fields = (("rollout_log_probs",) if carries_behaviour_log_probs(config) else ()) + (
            ("policy_version",) if config.fully_async else ()) + (
            (ATTENTION_FIELD,) if is_multi_turn(config) else ())  # environment turns (--env-path)
        self._cache: dict | None = None
        self._last_train_end: float | None = None
        # the weight route's training side (relax.runtime.weights.weight_sync): the run's transport,
        # handed in by whoever starts the workers (plain-Python callers get --weight-transport's)
        self.weight_sync = weight_sync if weight_sync is not None else make_weight_sync(config)
        # The engines' dtype is decided here, by the rank that publishes, on its own device: the driver
        # that built the transport may see another device than the workers (relax.rollout.hf.precision).
        self.weight_sync.dtype = publish_dtype(config)

    def init_process_group(self, address: str) -> bool:
        """Join the process group of all actor ranks at ``tcp://address``, then build the backend on it."""
        dist.init_process_group(self.backend_cls.process_group_kind(self.model), init_method=f"tcp://{address}",
                                rank=self.rank, world_size=self.world_size)
        self.backend = self.backend_cls.for_policy(self.config, self.model, process_group=dist.group.WORLD)
        if self.reference is not None:  # sharded with the policy when the backend shards (--sharding)
            self.reference = self.backend.shard_frozen(self.reference)
        if self.teacher is not None:
            self.teacher.shard_with(self.backend)
        return True

    @property
    def dp_rank(self) -> int:
        return self.backend.dp_rank

    @property
    def dp_group(self):
        """The group whose ranks hold different shards (None: this rank holds the whole step)."""
        return self.backend.dp_group if self.backend.dp_size > 1 else None

    def _rank0_of_collective(self, fn):
        """Rank 0's result of ``fn``; every rank calls it when the backend gathers over all ranks."""
        if self.backend.gathers_on_all_ranks or self.rank == 0:
            result = fn()
            return result if self.rank == 0 else None
        return None

    # -- the shard and its log-probs --------------------------------------------------------------

    def _read_shard(self, step: int, plan: StepPlan, extra: tuple[str, ...]) -> dict:
        uids = plan.rank_uids(self.dp_rank)
        t0 = time.perf_counter()
        # One task name per rank: model-parallel peers read the same groups, and TransferQueue
        # hands a sample to each task once. The rewards only when this rank computes the
        # advantages itself (else the deployment does).
        rewards = ("rewards",) if self.advantages_on_actor else ()
        fields = BATCH_FIELDS + rewards + self.sample_fields + extra
        read = self.data_plane.read(step, fields, f"actor{self.rank}", len(uids), uids)
        # The data plane hands CPU tensors: the whole shard moves to the model's device once, so that
        # every tensor of the step (log-probs, advantages, loss inputs) meets the others there.
        shard_fields = to_device(read.fields, self.backend.device)
        batch = token_batch(shard_fields) if uids else None
        return {"step": step, "read": read, "batch": batch, "fields": shard_fields,
                "time/actor/data_read_s": time.perf_counter() - t0}

    def _add_log_probs(self, shard: dict) -> dict:
        """Old (and reference, and teacher) log-probs of the shard, before any update of this step."""
        batch = shard["batch"]
        if batch is None and self.backend.forward_is_collective:
            # sharded weights (--sharding): every pass gathers from all ranks, so a rank without rows
            # still joins the others' passes (with no rows of its own)
            self.backend.compute_log_probs(masked_row().select(slice(0, 0)), with_entropy=True)
            if self.reference is not None:
                self._reference_log_probs(masked_row().select(slice(0, 0)))
        if batch is not None:
            mb = self.config.micro_batch_size
            # The entropy comes with the same forward pass: it is logged on every step whatever the
            # loss uses (policy_health_shares).
            old = self.backend.compute_log_probs(batch, micro_batch_size=mb, with_entropy=True)
            shard["old_log_probs"], shard["old_entropy"] = old.log_probs, old.entropy
            if self.reference is not None:
                shard["ref_log_probs"] = self._reference_log_probs(batch)
        if self.teacher is not None:  # after the policy's and reference's passes on every rank (lock-step)
            self.teacher.add_to(shard, batch, self.backend, top_k=self.algorithm.teacher_top_k())
        return shard

    def _reference_log_probs(self, batch: TokenBatch) -> torch.Tensor:
        if self.backend.forward_is_collective:  # a sharded reference: the backend keeps the ranks in step
            return self.backend.frozen_log_probs(self.reference, batch, micro_batch_size=self.config.micro_batch_size)
        return reference_log_probs(self.reference, batch, self.config)

    def _kl(self, shard: dict) -> torch.Tensor:
        """The reward-side per-token KL to the reference (estimator: ``--kl-loss-type``), zero outside
        the response."""
        kl = numerics.kl_estimate(shard["old_log_probs"], shard["ref_log_probs"], self.config.algorithm.kl_loss_type)
        return kl * shard["batch"].response_mask

    def prepare(self, step: int, plan: StepPlan) -> dict:
        """Old/reference log-probs of this rank's shard; writes the reward-side ``kl`` field (needed by
        the advantages before training can start)."""
        t0 = time.perf_counter()
        self._cache = self._add_log_probs(self._read_shard(step, plan, ()))
        if self._cache["batch"] is not None and self.reference is not None and self.backend.writes_shared_fields:
            self.data_plane.add_fields(self._cache["read"], {"kl": self._kl(self._cache).float().cpu()})
        return {"time/actor/prepare_s": time.perf_counter() - t0}

    # -- advantages -------------------------------------------------------------------------------

    def _request_advantages(self, step: int, plan: StepPlan, with_values: bool, with_kl: bool):
        """Rank 0 asks the Serve deployment for the whole step's advantages (None: not this rank's job)."""
        if self.advantages_on_actor or self.rank != 0 or not plan.num_groups or self.advantages_service is None:
            return None
        return self.advantages_service.compute.remote(
            step, plan.num_groups, plan.segment_sizes, with_values, with_kl, plan.uids, **self.advantages_run
        )

    def _read_advantages(self, step: int, plan: StepPlan, shard: dict) -> None:
        """This shard's advantages as the deployment wrote them (the read waits until they are)."""
        if shard["batch"] is not None:
            uids = plan.rank_uids(self.dp_rank)
            shard["fields"]["advantages"] = self.data_plane.read(
                step, ("advantages",), f"actor{self.rank}_advantages", len(uids), uids
            )["advantages"].to(self.backend.device, non_blocking=True)

    def _compute_advantages(self, plan: StepPlan, shard: dict, with_values: bool) -> None:
        """``compute_advantages`` on this shard with the data-parallel group: its batch statistics are
        collectives, so every rank calls it, also one that holds no group this step."""
        batch, seg = shard["batch"], plan.rank_segment_sizes(self.dp_rank)
        if batch is None and self.dp_group is None:
            return
        if batch is None:
            empty = torch.zeros((0, 1), device=self.backend.device)
            inputs = AdvantageInputs(
                rewards=empty.new_zeros(0), response_mask=empty.bool(), values=empty if with_values else None,
                kl=empty if self.reference is not None else None, segment_sizes=seg,
            )
        else:
            inputs = AdvantageInputs(
                rewards=shard["fields"]["rewards"].float(), response_mask=batch.response_mask,
                values=shard["fields"].get("values"), kl=self._kl(shard) if self.reference is not None else None,
                segment_sizes=seg,
            )
        output = self.algorithm.compute_advantages(inputs, process_group=self.dp_group)
        check_advantages_output(self.algorithm, output, inputs.response_mask.shape)
        shard["fields"]["advantages"], _ = output

    # -- the optimizer steps ----------------------------------------------------------------------

    def _optimizer_steps(self, plan: StepPlan, shard: dict) -> list[dict]:
        seg = plan.rank_segment_sizes(self.dp_rank)
        batch = shard["batch"]
        return [
            self._optimizer_step(shard, rows, batch.select(rows) if batch is not None else None,
                                 plan.global_tokens[j], plan.global_sequences[j])
            for j, rows in enumerate(segment_slices(seg))
        ]

    def _optimizer_step(self, shard, rows: slice, sub: TokenBatch | None, tokens: int, sequences: int) -> dict:
        # tokens 0: --overlong-filter left this mini-batch without a loss token; nothing to train on
        holds_rows = sub is not None and len(sub) > 0 and tokens > 0
        if not holds_rows:
            sub, loss_fn = masked_row(), zero_loss
        else:
            loss_fn = policy_loss_fn(
                self.algorithm,
                old_log_probs=shard["old_log_probs"][rows],
                advantages=shard["fields"]["advantages"][rows].float(),
                response_mask=sub.response_mask,
                ref_log_probs=shard["ref_log_probs"][rows] if "ref_log_probs" in shard else None,
                teacher_log_probs=shard["teacher_log_probs"][rows] if "teacher_log_probs" in shard else None,
                teacher_top_ids=shard["teacher_top_ids"][rows] if "teacher_top_ids" in shard else None,
                teacher_top_log_probs=shard["teacher_top_log_probs"][rows] if "teacher_top_ids" in shard else None,
                rollout_log_probs=(shard["fields"]["rollout_log_probs"][rows].float()
                                   if "rollout_log_probs" in shard["fields"] else None),
                global_num_tokens=tokens,
                global_num_sequences=sequences,
                max_response_length=self.config.rollout_max_response_len,
                step=shard["step"],
            )
        # a method reading the teacher's distribution (GKD) gets the student's whole one (check_teacher_distribution)
        distribution = {"with_distribution": True} if self.algorithm.teacher_top_k() is not None else {}
        metrics = self.backend.train_step(sub, loss_fn, micro_batch_size=self.config.micro_batch_size,
                                          with_entropy=self.config.algorithm.entropy_coef != 0.0, **distribution)
        if holds_rows:
            metrics.update(policy_health_shares(shard, rows, sub.response_mask, tokens,
                                                self.config.algorithm.kl_loss_type))
        return metrics

    # -- one training step ------------------------------------------------------------------------

    def train(self, step: int, plan: StepPlan, *, with_values: bool = False, with_kl: bool = False,
              return_weights: bool = True):
        """Optimizer steps on this rank's shard; returns ``(metrics, weights or None)``.

        ``metrics[STEP_METRICS_KEY]``: the backend's metrics of each optimizer step (shares of the
        mini-batch, see ``relax.runtime.metrics.actor_metrics``), or None on a rank whose model-parallel peer
        reports them.

        With the Serve advantages role, rank 0 sends the request right after reading its shard and
        computes the old log-probs while the deployment works (two processes, two cores); every rank
        then reads its advantages from the data plane.
        """
        t0 = time.perf_counter()
        idle = t0 - self._last_train_end if self._last_train_end is not None else 0.0
        shard, self._cache = self._cache, None
        fresh = shard is None or shard["step"] != step  # else prepare() has read it already
        if fresh:
            # Read first, then send the request: the two reads would only slow each other down on a
            # small machine.
            values = ("values",) if (self.advantages_on_actor and with_values) else ()
            shard = self._read_shard(step, plan, values)
        t_req = time.perf_counter()
        request = self._request_advantages(step, plan, with_values, with_kl)
        t_request = time.perf_counter() - t_req
        if fresh:
            shard = self._add_log_probs(shard)
        t1 = time.perf_counter()
        metrics = request.result() if request is not None else {}
        if not self.advantages_on_actor:
            self._read_advantages(step, plan, shard)
        t_adv = time.perf_counter()
        if self.advantages_on_actor:
            self._compute_advantages(plan, shard, with_values)
        if self.config.algorithm.off_policy_correction != "none":  # a collective over the data-parallel group
            metrics.update(off_policy_weight_metrics(shard, self.config.algorithm, self.dp_group,
                                                     self.backend.device))
        parts = self._optimizer_steps(plan, shard)
        t2 = time.perf_counter()
        # ``actor/*`` here is this rank's share (the whole value with one rank). The driver sums
        # the shares of all data-parallel ranks per optimizer step from STEP_METRICS_KEY; only one
        # rank of each model-parallel group hands them over (its peers hold the same numbers).
        metrics.update({logged_name(k): v for k, v in combine_actor_metrics([parts]).items()})
        metrics[STEP_METRICS_KEY] = parts if self.backend.writes_shared_fields else None
        if "policy_version" in shard["fields"]:
            metrics.update(staleness_metrics(step, shard["fields"]["policy_version"], self.config.staleness_bound))
        metrics.update({
            "time/train_idle_s": idle,  # since this rank's previous step: waiting for samples
            "time/actor/read_s": t1 - t0,  # advantages request + shard read + old/reference log-probs
            "time/actor/request_s": t_request,
            "time/actor/data_read_s": shard["time/actor/data_read_s"],
            "time/actor/wait_advantages_s": t_adv - t1,
            "time/actor/optimize_s": t2 - t_adv,
            **({TEACHER_TIME_KEY: shard[TEACHER_TIME_KEY]} if TEACHER_TIME_KEY in shard else {}),
            **gpu_peak_mib("perf/actor_gpu_peak_mib"),
        })
        weights = self.weight_sync.export(self.backend, self.rank) if return_weights else None
        self._last_train_end = time.perf_counter()
        return metrics, weights

    # -- checkpoints ------------------------------------------------------------------------------

    def state_dict(self) -> dict | None:
        """Rank 0's state (None on the other ranks, which may still take part in gathering it)."""
        backend = self._rank0_of_collective(self.backend.state_dict)
        return None if backend is None else {"backend": backend, "torch_rng": torch.get_rng_state()}

    def load_state_dict(self, state) -> bool:
        self.backend.load_state_dict(state["backend"])
        torch.set_rng_state(state["torch_rng"])
        return True


class ActorWorker(AttachesDataPlane, JoinsWeightGroup, ActorCore):
    """Ray actor for one training rank. Its entry points take the rollout's result (Ray resolves the
    reference when the rollout finishes) and plan the step themselves, so the driver can submit a
    whole step without waiting for any part of it."""

    def free_address(self) -> str:
        """``ip:port`` where this rank can host the process-group rendezvous."""
        import socket

        import ray

        ip = ray.util.get_node_ip_address()
        with socket.socket() as s:
            s.bind((ip, 0))
            return f"{ip}:{s.getsockname()[1]}"

    def set_advantages_service(self, handle, run: str | None = None) -> bool:
        """``run``: this run's name on a deployment that serves several (the kept cluster's)."""
        import logging

        logging.getLogger("ray.serve").setLevel(logging.WARNING)  # no INFO line per new router
        self.advantages_service = handle
        self.advantages_run = {} if run is None else {"run": run}
        return True

    def _plan(self, rolls) -> StepPlan:
        return plan_from_rollouts(rolls, self.num_minibatches, self.backend.dp_size)

    def prepare_step(self, step: int, *rolls: dict) -> dict:
        plan = self._plan(rolls)
        return self.prepare(step, plan) if plan.num_groups else {}

    def train_step(self, step: int, with_values: bool, with_kl: bool, *rolls: dict):
        """Two return values: (metrics, packed weights or None). ``rolls``: the rollout workers' reports."""
        plan = self._plan(rolls)
        if plan.num_groups == 0:
            return {}, None  # every group was dropped: nothing to train on, weights unchanged
        metrics, weights = self.train(step, plan, with_values=with_values, with_kl=with_kl)
        return metrics, (self.weight_sync.publish(weights, step) if weights is not None else None)

    def publish_weights(self, version: int):
        """The handle of this rank's current weights as policy ``version`` (rank 0; None on the others,
        which join the export when it gathers): how a restored run's rollout engines get its weights."""
        weights = self.weight_sync.export(self.backend, self.rank)
        return self.weight_sync.publish(weights, version) if weights is not None else None
