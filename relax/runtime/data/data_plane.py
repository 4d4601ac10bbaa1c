"""The data plane between roles: TransferQueue behind a five-method interface.

One partition per training step (``step_<k>``). The interface speaks in completions (``[N, ...]``
tensors plus the prompt-group uid of each row), but one TransferQueue *sample* holds one whole prompt
group (fields ``[G, ...]``): groups are kept whole by construction, and TransferQueue's cost, which is
mostly per sample (get_data: ~12 ms for 256 single-completion rows vs ~3 ms for 32 group rows of 8,
measured on 2 cores), drops by the group size. Every row carries its group uid in ``custom_meta`` and
every read goes through ``PromptGroupSampler``, which hands out the requested groups by uid.

Workarounds for TransferQueue 0.1.11 (see docs/en/ray-and-transferqueue.md#transferqueue-workarounds):

1. its controller and storage units each ask Ray for one CPU: the runtime starts Ray with more
   logical CPUs than cores, and we run a single storage unit;
2. in the default blocking mode an under-filled read freezes the controller for 5 s: we run it in
   ``polling_mode`` and retry on the client side;
3. non-scalar fields come back as jagged nested tensors: ``_densify`` turns them back into the
   dense ``[N, ...]`` tensors that were written (all our per-step fields are padded to one width);
4. ``GRPOGroupNSampler`` mixes prompts: we use our own uid-keyed sampler.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence

import torch

from relax.runtime.data.sampler import GROUP_SIZE, GROUP_UID, SAMPLE_INDEX
from relax.runtime.data.transferqueue_keeper import (
    KEEPER_NAME,
    KEEPER_NAMESPACE,
    TransferQueueKeeper,
    tq_config,
)

POLL_SLEEP_S = (0.0005, 0.001, 0.002, 0.005, 0.01)  # retry back-off of a polling read


PARTITION_PREFIX = "step_"
RUN_PREFIX_ENV = "RELAX_RUN_ID"  # the environment variable that names this run's data-plane partitions
# RUN_PREFIX_ENV is set by the driver for its workers (the job's runtime_env) when it starts or joins
# Ray: the runs that share a kept cluster's TransferQueue (``TransferQueueKeeper``) each see only their
# own partitions.


def partition_name(step: int, run_prefix: str | None = None) -> str:
    """``run_prefix``: a process serving several runs (the kept cluster's advantages replica) names
    the run; every other process is one run's, whose prefix is in its environment."""
    prefix = os.environ.get(RUN_PREFIX_ENV, "") if run_prefix is None else run_prefix
    return f"{prefix}{PARTITION_PREFIX}{step}"


def _densify(value: torch.Tensor, rows: int, name: str = "?") -> torch.Tensor:
    """A jagged nested tensor of uniform row shape -> the dense ``[rows, ...]`` tensor.

    Checked on the offsets, not by unbinding the rows: ``unbind`` of a jagged tensor costs about
    0.6 ms per field on 2 cores (Python dispatch per row), as much as TransferQueue's own transfer.
    """
    if not getattr(value, "is_nested", False):
        return value
    if value.layout == torch.jagged and value._lengths is None and value._ragged_idx == 1:
        lengths = value.offsets().diff()
        if len(lengths) != rows or bool((lengths != lengths[0]).any()):
            raise RuntimeError(f"{_RAGGED} (field {name!r}: {rows} rows expected, row lengths {lengths.tolist()})")
        values = value.values()
        return values.reshape(rows, int(lengths[0]), *values.shape[1:])
    parts = value.unbind()  # any other nested layout: the slow, general check
    shape = parts[0].shape
    if any(p.shape != shape for p in parts):
        if any(p.shape[:-1] != shape[:-1] for p in parts):
            raise RuntimeError(f"{_RAGGED} (field {name!r}: row shapes {[tuple(p.shape) for p in parts]})")
        return _pad_widths(parts, name)
    return torch.stack(parts) if value.layout != torch.jagged else value.values().reshape(rows, *shape)


# Prompts are left-padded (they end where the response starts); every other per-token field is
# right-padded (a response starts at column 0 of its fields).
LEFT_PADDED_FIELDS = frozenset({"prompt_ids", "prompt_mask"})


def _pad_widths(parts: list[torch.Tensor], name: str) -> torch.Tensor:
    """Rows written by different puts (several rollout workers pad to their own widths) -> one
    dense tensor, padded with zeros (False) to the widest row on the side the field is padded on."""
    width = max(p.shape[-1] for p in parts)
    left = name in LEFT_PADDED_FIELDS
    out = parts[0].new_zeros((len(parts), *parts[0].shape[:-1], width))
    for i, part in enumerate(parts):
        if left:
            out[i, ..., width - part.shape[-1] :] = part
        else:
            out[i, ..., : part.shape[-1]] = part
    return out


_RAGGED = (
    "TransferQueue returned rows of different shapes for one field; relax writes every field padded to "
    "one width per step, so this is a data-plane bug"
)


def group_rows(group_uids: torch.Tensor) -> tuple[list[int], torch.Tensor]:
    """Arrange completions into whole-group rows.

    Returns ``(uids, order)``: the distinct uids in order of first appearance and an index
    ``[num_groups, group_size]`` such that ``x[order[i]]`` are the completions of group ``uids[i]``
    in their original order. Every group must have the same size (the rollout drops whole groups).
    """
    uids: list[int] = []
    members: dict[int, list[int]] = {}
    for position, uid in enumerate(group_uids.tolist()):
        if uid not in members:
            members[uid] = []
            uids.append(uid)
        members[uid].append(position)
    sizes = {len(m) for m in members.values()}
    if len(sizes) > 1:
        raise ValueError(f"prompt groups must all have the same size, got sizes {sorted(sizes)}")
    return uids, torch.tensor([members[u] for u in uids], dtype=torch.long)


class StepBatch:
    """What a read returns: dense ``[num_groups * G, ...]`` fields plus the handle to add fields."""

    def __init__(self, fields: dict[str, torch.Tensor], meta):
        self.fields = fields
        self.meta = meta

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.fields[name]

    @property
    def num_groups(self) -> int:
        return self.meta.size if self.meta is not None else 0


class TransferQueueDataPlane:
    """Put / read / add fields / clear over TransferQueue. One instance per process.

    The process that calls ``start()`` owns the TransferQueue controller and storage (the driver);
    every other process calls ``attach()``.
    """

    def __init__(self, read_timeout_s: float = 120.0, run_prefix: str | None = None):
        self.read_timeout_s = read_timeout_s
        self.run_prefix = run_prefix  # None: this process's run (RUN_PREFIX_ENV)
        self._client = None
        self._owner = False

    # -- life cycle --
    def start(self, keep: bool = False) -> TransferQueueDataPlane:
        """Start TransferQueue in this Ray cluster, or join the one already running there (then
        this process does not own it and ``close`` leaves it up, e.g. a test session's shared one).
        ``keep``: start it inside a detached ``TransferQueueKeeper`` (a cluster the run joined), so
        that it stays up for the next run."""
        import ray
        import transfer_queue as tq

        try:
            ray.get_actor("TransferQueueController", namespace="transfer_queue")
            exists = True
        except ValueError:
            exists = False
        if not exists and keep:
            keeper = ray.remote(TransferQueueKeeper).options(
                name=KEEPER_NAME, namespace=KEEPER_NAMESPACE, lifetime="detached", get_if_exists=True, num_cpus=0,
            ).remote()
            ray.get(keeper.ready.remote())
            exists = True
        if exists:
            tq.init()  # attach
        else:
            tq.init(tq_config())
        self._client = tq.get_client()
        self._owner = not exists
        return self

    def attach(self) -> TransferQueueDataPlane:
        import transfer_queue as tq

        tq.init()
        self._client = tq.get_client()
        return self

    def close(self) -> None:
        if self._client is None:
            return
        import transfer_queue as tq

        if self._owner:
            tq.close()
        self._client = None

    @property
    def client(self):
        if self._client is None:
            raise RuntimeError("the data plane is not started: call start() or attach() first")
        return self._client

    # -- data --
    def put_step(self, step: int, fields: Mapping[str, torch.Tensor], group_uids: torch.Tensor) -> int:
        """Insert one step's completions into partition ``step_<step>``; returns the group count.

        ``fields``: name -> ``[N, ...]``; ``group_uids`` ``[N]``: the prompt group of each completion.
        Groups are stored whole (one TransferQueue sample each), so a reader gets all completions
        of a group or none.
        """
        from tensordict import TensorDict

        n = int(group_uids.shape[0])
        if n == 0:
            return 0
        for name, value in fields.items():
            if value.shape[0] != n:
                raise ValueError(f"field {name!r} has {value.shape[0]} rows, expected {n} (one per completion)")
        uids, order = group_rows(group_uids)
        rows = len(uids)
        data = TensorDict({name: value[order] for name, value in fields.items()}, batch_size=[rows])
        meta = self.client.get_meta(
            data_fields=list(fields), batch_size=rows, partition_id=partition_name(step, self.run_prefix), mode="insert"
        )
        meta.update_custom_meta([{GROUP_UID: u, GROUP_SIZE: 1, SAMPLE_INDEX: i} for i, u in enumerate(uids)])
        self.client.put(data=data, metadata=meta)
        return rows

    def read(
        self,
        step: int,
        fields: Sequence[str],
        task: str,
        num_groups: int,
        group_uids: Sequence[int] | None = None,
    ) -> StepBatch:
        """Read ``fields`` of whole prompt groups from ``step_<step>`` as task ``task``.

        ``group_uids`` None reads every group (``num_groups`` of them); otherwise exactly those
        groups (``num_groups == len(group_uids)``). The read waits until they are all written.
        Completions come back flattened to ``[num_groups * G, ...]``, group by group (in
        ``group_uids`` order, else in write order), each group in its original order.
        """
        if group_uids is not None and len(group_uids) != num_groups:
            raise ValueError(f"num_groups={num_groups} but {len(group_uids)} group uids requested")
        if num_groups == 0:
            return StepBatch({name: torch.empty(0) for name in fields}, None)
        config = {} if group_uids is None else {"group_uids": list(group_uids)}
        deadline = time.monotonic() + self.read_timeout_s
        attempt = 0
        while True:
            meta = self.client.get_meta(
                data_fields=list(fields),
                batch_size=num_groups,
                partition_id=partition_name(step, self.run_prefix),
                mode="fetch",
                task_name=task,
                sampling_config=config,
            )
            if meta.size:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"data plane: task {task!r} waited {self.read_timeout_s:.0f}s for {num_groups} groups "
                    f"with fields {list(fields)} in partition {partition_name(step, self.run_prefix)}; a producer "
                    "probably failed (see the worker logs above)"
                )
            time.sleep(POLL_SLEEP_S[min(attempt, len(POLL_SLEEP_S) - 1)])
            attempt += 1
        if meta.size != num_groups:
            raise RuntimeError(
                f"data plane: task {task!r} asked for {num_groups} groups of {partition_name(step, self.run_prefix)} "
                f"but the sampler returned {meta.size}"
            )
        data = self.client.get_data(meta)
        dense = {name: _densify(data[name], meta.size, name).flatten(0, 1) for name in fields}
        return StepBatch(dense, meta)

    def add_fields(self, batch: StepBatch, fields: Mapping[str, torch.Tensor]) -> None:
        """Write new ``[num_groups * G, ...]`` fields for exactly the completions of a previous read
        (same order)."""
        from tensordict import TensorDict

        rows = batch.num_groups
        if rows == 0:
            return
        data = TensorDict({k: v.reshape(rows, -1, *v.shape[1:]) for k, v in fields.items()}, batch_size=[rows])
        self.client.put(data=data, metadata=batch.meta)

    def clear(self, step: int) -> None:
        """Drop partition ``step_<step>`` (its samples, metadata and consumption state)."""
        self.client.clear_partition(partition_name(step, self.run_prefix))

    def clear_steps(self) -> None:
        """Drop every step partition (a run stopped with steps in flight or not dropped yet)."""
        for name in self.client.get_partition_list():
            if name.startswith(partition_name(0, self.run_prefix)[: -1]):  # this run's prefix
                self.client.clear_partition(name)
