"""The actor role (one Ray actor per data-parallel rank) and the critic role (PPO).

Each actor rank reads its shard of the step from the data plane, computes the old (and, with a KL
term, reference) log-probs, and runs one optimizer step per mini-batch with ``algorithm.policy_loss``
normalized by the mini-batch's *global* token and sequence counts, so micro-batching and data
parallelism reproduce the single-process loss exactly; its metrics are shares in the same way,
summed over ranks by the driver (``relax.runtime.actor_metrics``). Rank 0 returns the new weights for the
rollout. ``ActorCore`` / ``CriticCore`` are plain Python; the ``*Worker`` classes are the Ray actors.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from relax.algorithms import AdvantageInputs, PolicyLossInputs, load_algorithm
from relax.algorithms import numerics as N
from relax.backends.base import TokenBatch
from relax.backends.torch_backend import TorchBackend, response_log_probs
from relax.runtime import components
from relax.runtime.actor_metrics import STEP_METRICS_KEY, combine_actor_metrics
from relax.runtime.schedule import StepPlan, plan_step
from relax.runtime.weights import pack_weights

BATCH_FIELDS = ("prompt_ids", "prompt_mask", "response_ids", "response_mask")


def num_minibatches(config) -> int:
    """Optimizer steps per rollout (the CLI fills ``num_steps_per_rollout``; derived otherwise)."""
    if config.num_steps_per_rollout:
        return int(config.num_steps_per_rollout)
    if config.global_batch_size:
        total = config.rollout_batch_size * config.algorithm.n_samples_per_prompt
        return max(1, total // config.global_batch_size)
    return 1


def token_batch(fields) -> TokenBatch:
    return TokenBatch(
        prompt_ids=fields["prompt_ids"].long(),
        prompt_mask=fields["prompt_mask"].bool(),
        response_ids=fields["response_ids"].long(),
        response_mask=fields["response_mask"].bool(),
    )


def _offsets(sizes) -> list[slice]:
    out, start = [], 0
    for s in sizes:
        out.append(slice(start, start + s))
        start += s
    return out


def _mean_metrics(parts: list[dict]) -> dict[str, float]:
    keys = {k for p in parts for k in p}
    return {k: sum(p[k] for p in parts if k in p) / sum(1 for p in parts if k in p) for k in sorted(keys)}


class ActorCore:
    """One training rank. With ``--backend megatron`` the ranks are data x tensor x pipeline
    parallel: a rank's data shard is chosen by its *data-parallel* rank, tensor/pipeline peers read
    the same shard, and every rank joins every backend call (Megatron's gathers are collectives)."""

    def __init__(self, config, algorithm_spec: str, rank: int = 0, world_size: int = 1, *, with_reference: bool,
                 advantages_on_actor: bool, data_plane=None):
        torch.set_num_threads(1)
        torch.manual_seed(config.seed + rank)
        self.config = config
        self.rank, self.world_size = rank, world_size
        self.algorithm = load_algorithm(algorithm_spec)(config.algorithm)
        self.model = components.build_policy_model(config)
        self.reference = components.build_reference_model(config) if with_reference else None
        self.advantages_on_actor = advantages_on_actor
        self.process_group = None
        self.megatron = config.backend == "megatron"
        # Data-parallel identity: which shard this rank reads. Megatron's comes from its backend.
        self.dp_rank, self.dp_size = rank, world_size
        self.backend = None
        # Megatron builds its parallel state on the process group, so with several ranks it waits
        # for init_process_group; a single rank starts a one-process group itself.
        if not self.megatron or world_size == 1:
            self._set_backend(self._make_backend())
        self.data_plane = data_plane
        self.advantages_service = None  # the Serve handle; rank 0 sends it the step's request
        self.num_minibatches = num_minibatches(config)
        self._cache: dict | None = None

    def _make_backend(self):
        if self.megatron:
            import warnings

            from relax.backends.megatron.factory import make_megatron_backend

            with warnings.catch_warnings():  # megatron-core's notes on optional fused kernels, once per rank
                warnings.filterwarnings("ignore", message="Apex is not installed")
                return make_megatron_backend(self.config, self.model)
        return TorchBackend(
            self.model,
            lr=self.config.lr,
            clip_grad=self.config.clip_grad,
            temperature=self.config.rollout_temperature,
            process_group=self.process_group,
            forward_logits=components.forward_logits_fn(self.config),
        )

    def _set_backend(self, backend) -> None:
        self.backend = backend
        if self.megatron:
            self.dp_rank, self.dp_size = backend.dp_rank, backend.dp_size
            # Tensor/pipeline peers hold the same shard: one of them writes shared fields (KL).
            self.writes_shared_fields = backend.tp_rank == 0 and backend.is_first_stage
        else:
            self.writes_shared_fields = True

    @property
    def dp_group(self):
        """The group whose ranks hold different shards (None: this rank holds the whole step)."""
        if self.dp_size == 1:
            return None
        return self.backend.dp_group if self.megatron else self.process_group

    def init_process_group(self, address: str) -> bool:
        """Join the process group of all actor ranks (gloo on CPU, nccl for CUDA models) at ``tcp://address``."""
        on_gpu = torch.cuda.is_available() and (self.megatron or next(self.model.parameters()).is_cuda)
        dist.init_process_group("nccl" if on_gpu else "gloo", init_method=f"tcp://{address}", rank=self.rank,
                                world_size=self.world_size)
        self.process_group = dist.group.WORLD
        if self.megatron:
            self._set_backend(self._make_backend())  # the backend makes its own dp/tp/pp groups
        else:
            self.backend.process_group = self.process_group
        return True

    def _rank0_of_collective(self, fn):
        """Megatron gathers weights over tensor/pipeline ranks: every rank calls ``fn``, rank 0 keeps
        the result. The torch backend holds whole weights on every rank: only rank 0 calls it."""
        if self.megatron or self.rank == 0:
            result = fn()
            return result if self.rank == 0 else None
        return None

    # -- phase 1 (only when the advantages need KL): log-probs, written to the data plane --
    def _read_shard(self, step: int, plan: StepPlan, extra: tuple[str, ...]) -> dict:
        uids = plan.rank_uids(self.dp_rank)
        t0 = time.perf_counter()
        # One task name per rank: tensor/pipeline peers read the same groups, and TransferQueue
        # hands a sample to each task once.
        # The rewards only when this rank computes the advantages itself (else the deployment does).
        rewards = ("rewards",) if self.advantages_on_actor else ()
        read = self.data_plane.read(step, BATCH_FIELDS + rewards + extra, f"actor{self.rank}", len(uids), uids)
        batch = token_batch(read.fields) if uids else None
        return {"step": step, "read": read, "batch": batch, "fields": dict(read.fields),
                "time/actor/data_read_s": time.perf_counter() - t0}

    def _add_log_probs(self, cache: dict) -> dict:
        """Old (and reference) log-probs of the shard, before any update of this step."""
        batch = cache["batch"]
        if batch is not None:
            mb = self.config.micro_batch_size
            cache["old_log_probs"] = self.backend.compute_log_probs(batch, micro_batch_size=mb).log_probs
            if self.reference is not None:
                cache["ref_log_probs"] = self._reference_log_probs(batch)
        return cache

    def _load_shard(self, step: int, plan: StepPlan, extra: tuple[str, ...]) -> dict:
        return self._add_log_probs(self._read_shard(step, plan, extra))

    @torch.no_grad()
    def _reference_log_probs(self, batch: TokenBatch) -> torch.Tensor:
        forward = components.forward_logits_fn(self.config)
        size = self.config.micro_batch_size or len(batch)
        parts = []
        for start in range(0, len(batch), size):
            sub = batch.select(slice(start, start + size))
            logits = forward(self.reference, sub.input_ids, sub.attention_mask, sub.position_ids)
            parts.append(response_log_probs(logits, sub, with_entropy=False,
                                            temperature=self.config.rollout_temperature).log_probs)
        return torch.cat(parts)

    def prepare(self, step: int, plan: StepPlan) -> dict:
        """Old/reference log-probs of this rank's shard; writes the reward-side ``kl`` field."""
        t0 = time.perf_counter()
        self._cache = self._load_shard(step, plan, ())
        if self._cache["batch"] is not None and self.reference is not None and self.writes_shared_fields:
            kl = N.kl_estimate(self._cache["old_log_probs"], self._cache["ref_log_probs"], "k1")
            kl = kl * self._cache["batch"].response_mask
            self.data_plane.add_fields(self._cache["read"], {"kl": kl.float()})
        return {"time/actor/prepare_s": time.perf_counter() - t0}

    # -- phase 2: the optimizer steps --
    def train(self, step: int, plan: StepPlan, *, with_values: bool = False, with_kl: bool = False,
              return_weights: bool = True):
        """Optimizer steps on this rank's shard; returns ``(metrics, weights or None)``.

        ``metrics[STEP_METRICS_KEY]``: the backend's metrics of each optimizer step (shares of the
        mini-batch, see ``relax.runtime.actor_metrics``), or None on a rank whose tensor/pipeline
        peer reports them.

        With the Serve advantages role, rank 0 sends the request first and computes the old
        log-probs while the deployment works (two processes, two cores); every rank then reads
        its advantages from the data plane (the read waits until they are written).
        """
        t0 = time.perf_counter()
        serve = not self.advantages_on_actor
        cache, self._cache = self._cache, None
        fresh = cache is None or cache["step"] != step
        if fresh:
            # Read first, then send the advantages request: the two reads would only slow each
            # other down on a small machine; the deployment then works while we compute log-probs.
            extra = ("values",) if (self.advantages_on_actor and with_values) else ()
            cache = self._read_shard(step, plan, extra)
        request = None
        t_req = time.perf_counter()
        if serve and self.rank == 0 and plan.num_groups and self.advantages_service is not None:
            request = self.advantages_service.compute.remote(
                step, plan.num_groups, plan.segment_sizes, with_values, with_kl
            )
        t_request = time.perf_counter() - t_req
        if fresh:
            cache = self._add_log_probs(cache)
        t1 = time.perf_counter()
        extra_metrics = {}
        if request is not None:
            extra_metrics.update(request.result())
        if serve and cache["batch"] is not None:
            uids = plan.rank_uids(self.dp_rank)
            cache["fields"]["advantages"] = self.data_plane.read(
                step, ("advantages",), f"actor{self.rank}_advantages", len(uids), uids
            )["advantages"]
        t_adv = time.perf_counter()
        seg = plan.rank_segment_sizes(self.dp_rank)
        metrics_parts = []
        batch = cache["batch"]
        if self.advantages_on_actor and (batch is not None or self.dp_group is not None):
            # Every rank reaches compute_advantages (its statistics are collectives), even one
            # that holds no group this step.
            if batch is None:
                empty = torch.zeros((0, 1))
                inputs = AdvantageInputs(
                    rewards=torch.zeros(0), response_mask=empty.bool(),
                    values=empty if with_values else None, kl=empty if self.reference is not None else None,
                    segment_sizes=seg,
                )
            else:
                kl = None
                if self.reference is not None:
                    kl = N.kl_estimate(cache["old_log_probs"], cache["ref_log_probs"], "k1") * batch.response_mask
                inputs = AdvantageInputs(
                    rewards=cache["fields"]["rewards"].float(), response_mask=batch.response_mask,
                    values=cache["fields"].get("values"), kl=kl, segment_sizes=seg,
                )
            advantages, _ = self.algorithm.compute_advantages(inputs, process_group=self.dp_group)
            cache["fields"]["advantages"] = advantages
        for j, rows in enumerate(_offsets(seg)):
            sub = batch.select(rows) if batch is not None else None
            metrics_parts.append(self._optimizer_step(cache, rows, sub, plan.global_tokens[j], plan.global_sequences[j]))
        t2 = time.perf_counter()
        # ``actor/*`` here is this rank's share (the whole value with one rank). The driver sums
        # the shares of all data-parallel ranks per optimizer step from STEP_METRICS_KEY; only one
        # rank of each tensor/pipeline group hands them over (its peers hold the same numbers).
        metrics = {f"actor/{k}": v for k, v in combine_actor_metrics([metrics_parts]).items()}
        metrics[STEP_METRICS_KEY] = metrics_parts if self.writes_shared_fields else None
        metrics.update(extra_metrics)
        metrics.update({
            "time/actor/read_s": t1 - t0,  # advantages request + shard read + old/reference log-probs
            "time/actor/request_s": t_request,
            "time/actor/data_read_s": cache["time/actor/data_read_s"],
            "time/actor/wait_advantages_s": t_adv - t1,
            "time/actor/optimize_s": t2 - t_adv,
        })
        weights = self._rank0_of_collective(self.backend.export_weights) if return_weights else None
        return metrics, weights

    def _optimizer_step(self, cache, rows: slice, sub: TokenBatch | None, tokens: int, sequences: int) -> dict:
        if sub is None or len(sub) == 0:
            sub = _empty_batch(cache)
            fields = None
        else:
            fields = {name: cache[name][rows] for name in ("old_log_probs", "ref_log_probs") if name in cache}
            fields["advantages"] = cache["fields"]["advantages"][rows].float()
        want_entropy = self.config.algorithm.entropy_coef != 0.0

        def loss_fn(tlp, micro: slice):
            if fields is None:  # this rank holds nothing of the mini-batch: zero loss, still reduce
                return _zero_loss(tlp)
            return self.algorithm.policy_loss(
                PolicyLossInputs(
                    log_probs=tlp.log_probs,
                    old_log_probs=fields["old_log_probs"][micro],
                    advantages=fields["advantages"][micro],
                    response_mask=sub.response_mask[micro],
                    ref_log_probs=fields["ref_log_probs"][micro] if "ref_log_probs" in fields else None,
                    entropy=tlp.entropy,
                    global_num_tokens=float(tokens),
                    global_num_sequences=float(sequences),
                )
            )

        return self.backend.train_step(
            sub, loss_fn, micro_batch_size=self.config.micro_batch_size, with_entropy=want_entropy
        )

    # -- checkpoints --
    def state_dict(self) -> dict | None:
        """Rank 0's state (None on the other ranks; Megatron's ranks all take part in gathering it)."""
        backend = self._rank0_of_collective(self.backend.state_dict)
        return None if backend is None else {"backend": backend, "torch_rng": torch.get_rng_state()}

    def load_state_dict(self, state) -> bool:
        self.backend.load_state_dict(state["backend"])
        torch.set_rng_state(state["torch_rng"])
        return True

    def export_weights(self) -> dict | None:
        return self._rank0_of_collective(self.backend.export_weights)


def _empty_batch(cache) -> TokenBatch:
    """One fully masked dummy row, for a rank that holds nothing of a mini-batch: it still runs a
    forward/backward (zero loss, zero gradient) so that it joins the gradient all-reduce."""
    one = torch.zeros((1, 1), dtype=torch.long)
    return TokenBatch(prompt_ids=one, prompt_mask=torch.ones((1, 1), dtype=torch.bool), response_ids=one,
                      response_mask=torch.zeros((1, 1), dtype=torch.bool))


def _zero_loss(tlp):
    from relax.algorithms import PolicyLossOutput

    return PolicyLossOutput(loss=tlp.log_probs.sum() * 0.0, metrics={})


class CriticCore:
    """PPO's value model: reads the whole step (one worker), writes ``values``, then trains on the
    ``returns`` of the advantages role with the clipped value loss."""

    def __init__(self, config, data_plane=None):
        torch.set_num_threads(1)
        self.config = config
        self.model = components.ValueModel(components.build_policy_model(config))
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=config.critic_lr, weight_decay=0.0)
        self.data_plane = data_plane
        self.num_minibatches = num_minibatches(config)
        self._cache = None

    def values(self, step: int, plan: StepPlan) -> dict:
        t0 = time.perf_counter()
        read = self.data_plane.read(step, BATCH_FIELDS, "critic", plan.num_groups)
        batch = token_batch(read.fields)
        with torch.no_grad():
            self.model.eval()
            values = components.response_values(self.model, batch)
        self.data_plane.add_fields(read, {"values": values})
        self._cache = {"step": step, "batch": batch, "values": values}
        return {"time/critic/values_s": time.perf_counter() - t0}

    def train(self, step: int, plan: StepPlan) -> dict:
        t0 = time.perf_counter()
        cache, self._cache = self._cache, None
        if cache is None or cache["step"] != step:
            raise RuntimeError(f"critic.train({step}) without critic.values({step}) first")
        returns = self.data_plane.read(step, ("returns",), "critic_returns", plan.num_groups)["returns"].float()
        batch, old_values = cache["batch"], cache["values"]
        parts = []
        self.model.train()
        for j, rows in enumerate(_offsets(plan.segment_sizes)):
            sub = batch.select(rows)
            self.optimizer.zero_grad(set_to_none=False)
            values = components.response_values(self.model, sub)
            loss, clipfrac = N.value_loss(
                values, old_values[rows], returns[rows], sub.response_mask, self.config.value_clip,
                "token_mean", global_num_tokens=float(plan.global_tokens[j]),
            )
            loss.backward()
            clip = self.config.clip_grad if self.config.clip_grad and self.config.clip_grad > 0 else float("inf")
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip))
            self.optimizer.step()
            parts.append({"value_loss": float(loss.detach()), "value_clipfrac": float(clipfrac), "grad_norm": grad_norm})
        metrics = {f"critic/{k}": v for k, v in _mean_metrics(parts).items()}
        metrics["time/critic/train_s"] = time.perf_counter() - t0
        return metrics

    def state_dict(self) -> dict:
        return {
            "model": {k: v.detach().clone() for k, v in self.model.state_dict().items()},
            "optimizer": self.optimizer.state_dict(),
        }

    def load_state_dict(self, state) -> bool:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        return True


def plan_from_rollout(roll: dict, num_minibatches: int, world_size: int) -> StepPlan:
    """Every role derives the same plan from the rollout's result (a pure function)."""
    return plan_step(roll["kept_uids"], roll["group_tokens"], roll["group_size"], num_minibatches, world_size)


class _Attaching:
    def attach(self) -> bool:
        from relax.runtime.data_plane import TransferQueueDataPlane

        self.data_plane = TransferQueueDataPlane().attach()
        return True


class ActorWorker(_Attaching, ActorCore):
    """Ray actor for one data-parallel rank. Its entry points take the rollout's result (Ray
    resolves the reference when the rollout finishes) and plan the step themselves, so the driver
    can submit a whole step without waiting for any part of it."""

    def free_address(self) -> str:
        """``ip:port`` where this rank can host the process-group rendezvous."""
        import socket

        import ray

        ip = ray.util.get_node_ip_address()
        with socket.socket() as s:
            s.bind((ip, 0))
            return f"{ip}:{s.getsockname()[1]}"

    def set_advantages_service(self, handle) -> bool:
        import logging

        logging.getLogger("ray.serve").setLevel(logging.WARNING)  # no INFO line per new router
        self.advantages_service = handle
        return True

    def _plan(self, roll: dict) -> StepPlan:
        return plan_from_rollout(roll, self.num_minibatches, self.dp_size)

    def prepare_step(self, step: int, roll: dict) -> dict:
        plan = self._plan(roll)
        return self.prepare(step, plan) if plan.num_groups else {}

    def train_step(self, step: int, roll: dict, with_values: bool = False, with_kl: bool = False):
        """Two return values: (metrics, packed weights or None)."""
        plan = self._plan(roll)
        if plan.num_groups == 0:
            return {}, None  # every group was dropped: nothing to train on, weights unchanged
        metrics, weights = self.train(step, plan, with_values=with_values, with_kl=with_kl)
        # One byte buffer crosses to the rollout faster than a dict of tensors (relax.runtime.weights).
        return metrics, (pack_weights(weights) if weights is not None else None)


class CriticWorker(_Attaching, CriticCore):
    """Ray actor of the critic (takes the rollout's result, like ``ActorWorker``)."""

    def values_step(self, step: int, roll: dict) -> dict:
        plan = plan_from_rollout(roll, self.num_minibatches, 1)
        return self.values(step, plan) if plan.num_groups else {}

    def train_step(self, step: int, roll: dict) -> dict:
        plan = plan_from_rollout(roll, self.num_minibatches, 1)
        return self.train(step, plan) if plan.num_groups else {}
