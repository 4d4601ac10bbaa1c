"""``--weight-transport collective``: a ``torch.distributed`` broadcast from actor rank 0 to every
rollout worker, over a process group of their own (gloo on the CPU, NCCL when every end has a GPU of its own).

**The group.** Actor rank 0 (rank 0 of this group) hosts its rendezvous: a ``TCPStore`` on a port the
operating system picks, so two runs on one machine never collide; rollout worker ``i`` joins as rank
``i + 1``. The group is built directly on that store (``ProcessGroupGloo`` / ``ProcessGroupNCCL``),
not with ``init_process_group``: the actor ranks' data-parallel group stays the process's default
group, and the rollout workers are not part of it. The driver connects the ends once at start-up
(``CollectiveSync.connect``).

**The exchange.** Publishing a version is a broadcast every end must enter at once, while the step's
Ray calls are strictly ordered per worker: a rollout that samples with version ``v`` is queued behind
earlier rollouts (``--fully-async``: up to K of them), and actor rank 0 goes on training. So each
end enters through a *port*, a thread of its own: ``publish`` on rank 0 copies the weights into one
flat buffer and queues it to the sender thread, which announces the version in the store (its
layout: names, dtypes, shapes) and broadcasts the buffer; each rollout worker's receiver thread
waits for the announcement, receives the buffer and keeps it by version. ``receive`` in the rollout
call then takes version ``v`` from the kept ones (waiting for it if the broadcast is still under
way); once a rollout samples with ``v``, the older ones are dropped (``forget_older``). The step's
Ray graph is the object store's: the handle that travels is a ``Ticket`` (the version), not the
weights.

The bytes are copied, never converted, so the engine receives the object store's weights bit for bit.
"""

from __future__ import annotations

import datetime
import pickle
import queue
import threading
from collections.abc import Mapping

import attrs
import torch

from relax.runtime.weights.weight_sync import WeightSync, in_dtype
from relax.runtime.weights.weights import WeightsLayout, pack_flat

EXCHANGE_TIMEOUT_S = 600.0  # one broadcast, or a rollout waiting for a version announced to it
# An idle receiver waits in a blocking ``get`` of the next announcement, as long as a run may train
# between two publishes (a store's wait that times out logs a warning each time).
_IDLE = datetime.timedelta(days=7)
_SPARES = 2  # buffers of sent or dropped versions kept for the next ones (no fresh 2x-model allocation)


@attrs.frozen
class WeightGroup:
    """Where the ends of the collective transport meet: actor rank 0's store and the group's size."""

    address: str  # host:port of the TCPStore on actor rank 0
    world_size: int  # actor rank 0 and every rollout worker
    kind: str  # the process group's: "gloo" or "nccl"


@attrs.frozen
class Ticket:
    """What the pipeline hands a rollout in place of the weights: the version to take from its port."""

    version: int


def group_kind(devices: list[str]) -> str:
    """NCCL when every end's model is on a GPU of its own (``devices``: the words of
    ``relax.runtime.step.placement.describe``), else gloo, with the buffers on the CPU. Two ends that
    may share a GPU (the same description: one GPU split between actor rank 0 and a rollout worker)
    cannot be ranks of one NCCL communicator."""
    on_gpus = bool(devices) and all(d.startswith("cuda") for d in devices)
    return "nccl" if on_gpus and len(set(devices)) == len(devices) else "gloo"


def _node_ip() -> str:
    """This machine's address as Ray knows it (the loopback address outside Ray)."""
    import ray

    return ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"


def _process_group(store, rank: int, size: int, kind: str, timeout: datetime.timedelta):
    import torch.distributed as dist

    store = dist.PrefixStore("relax-weights/", store)
    if kind == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, size, options)
    return dist.ProcessGroupGloo(store, rank, size, timeout)


def _broadcast(group, flat: torch.Tensor) -> None:
    import torch.distributed as dist

    options = dist.BroadcastOptions()
    options.rootRank = 0
    group.broadcast([flat], options).wait()
    if flat.is_cuda:
        torch.cuda.synchronize(flat.device)  # the buffer is read on another thread's stream next


class CollectiveSync(WeightSync):
    """The broadcast transport. Built on the driver (plain data, pickled to each worker); ``open`` and
    ``join`` make the group in the worker's process."""

    def __init__(self, dtype: torch.dtype | None = None, timeout_s: float = EXCHANGE_TIMEOUT_S):
        self.dtype, self.timeout_s = dtype, timeout_s
        self._reset()

    def _reset(self) -> None:
        self._store = self._group = self._thread = self._error = None
        self._address, self._rank, self._device = None, None, torch.device("cpu")
        self._outbox: queue.Queue = queue.Queue()
        self._kept: dict[int, tuple[WeightsLayout, torch.Tensor]] = {}
        self._arrived = threading.Condition()
        self._spares: list[torch.Tensor] = []  # guarded by _arrived's lock

    def __getstate__(self) -> dict:
        return {"dtype": self.dtype, "timeout_s": self.timeout_s}  # a live group never travels

    def __setstate__(self, state: dict) -> None:
        self.__init__(**state)

    # -- connecting (start-up) ------------------------------------------------------------------

    def open(self) -> str:
        """Actor rank 0: host the group's store on a free port; returns ``ip:port`` for the others."""
        import torch.distributed as dist

        ip = _node_ip()
        timeout = datetime.timedelta(seconds=self.timeout_s)
        self._store = dist.TCPStore(ip, 0, is_master=True, wait_for_workers=False, timeout=timeout)
        self._address = f"{ip}:{self._store.port}"
        return self._address

    def join(self, group: WeightGroup, rank: int) -> None:
        """Enter the group (rank 0: actor rank 0, after ``open``), then start this end's port thread."""
        import torch.distributed as dist

        timeout = datetime.timedelta(seconds=self.timeout_s)
        self._address, self._rank = group.address, rank
        host, port = group.address.rsplit(":", 1)
        try:
            if self._store is None:
                self._store = dist.TCPStore(host, int(port), is_master=False, timeout=timeout)
            if group.kind == "nccl":
                self._device = torch.device("cuda", torch.cuda.current_device())
            self._group = _process_group(self._store, rank, group.world_size, group.kind, timeout)
        except Exception as exc:
            who = "actor rank 0" if rank == 0 else f"rollout worker {rank - 1}"
            raise RuntimeError(f"--weight-transport collective: {who} could not join the weight group at "
                               f"{group.address} ({group.kind}, {group.world_size} ranks; the store is "
                               f"hosted by actor rank 0): {type(exc).__name__}: {exc}") from exc
        loop = self._send_loop if rank == 0 else self._receive_loop
        self._thread = threading.Thread(target=self._guarded, args=(loop,), daemon=True,
                                        name=f"relax-weights-{'sender' if rank == 0 else 'receiver'}")
        self._thread.start()

    def _guarded(self, loop) -> None:
        if self._device.type == "cuda":
            torch.cuda.set_device(self._device)
        try:
            loop()
        except Exception as exc:  # noqa: BLE001 - raised by the next publish/receive on the worker's thread
            with self._arrived:
                self._error = exc
                self._arrived.notify_all()

    def _failed(self, what: str) -> RuntimeError:
        return RuntimeError(f"--weight-transport collective: {what} (weight group at {self._address}): "
                            f"{type(self._error).__name__}: {self._error}")

    # -- actor rank 0 ---------------------------------------------------------------------------

    def publish(self, weights: Mapping[str, torch.Tensor], version: int) -> Ticket:
        """Copy ``weights`` now (training goes on) and queue their broadcast; the handle is a ``Ticket``."""
        if self._group is None:
            raise RuntimeError("--weight-transport collective: publish before the weight group was joined "
                               "(CollectiveSync.connect)")
        if self._error is not None:
            raise self._failed(f"the broadcast before version {version} failed")
        layout, flat = pack_flat(in_dtype(weights, self.dtype), self._device, reuse=self._spare)
        if flat.is_cuda:
            torch.cuda.current_stream(flat.device).synchronize()  # the sender thread reads it next
        self._outbox.put((version, layout, flat))
        return Ticket(version)

    def _send_loop(self) -> None:
        sequence = 0
        while True:
            version, layout, flat = self._outbox.get()
            sequence += 1
            self._store.set(f"publish/{sequence}", pickle.dumps((version, layout)))
            _broadcast(self._group, flat)
            self._keep_spare(flat)

    # -- rollout workers ------------------------------------------------------------------------

    def _receive_loop(self) -> None:
        import torch.distributed as dist

        host, port = self._address.rsplit(":", 1)
        announcements = dist.TCPStore(host, int(port), is_master=False, timeout=_IDLE)  # this thread's own
        sequence = 0
        while True:
            sequence += 1
            version, layout = pickle.loads(announcements.get(f"publish/{sequence}"))
            flat = self._spare(layout.nbytes)
            if flat is None:
                flat = torch.empty(layout.nbytes, dtype=torch.uint8, device=self._device)
            _broadcast(self._group, flat)
            with self._arrived:
                self._kept[version] = (layout, flat)
                self._arrived.notify_all()

    # A page-faulted fresh buffer costs as much as the copy into it: sent and dropped ones are reused.
    def _spare(self, nbytes: int) -> torch.Tensor | None:
        with self._arrived:
            for i, flat in enumerate(self._spares):
                if flat.numel() == nbytes:
                    return self._spares.pop(i)
        return None

    def _keep_spare(self, flat: torch.Tensor) -> None:
        with self._arrived:
            self._spares = [flat, *self._spares][:_SPARES]

    def take(self, version: int) -> dict[str, torch.Tensor]:
        """The weights of ``version`` (waiting for their broadcast)."""
        with self._arrived:
            ready = self._arrived.wait_for(lambda: version in self._kept or self._error is not None,
                                           timeout=self.timeout_s)
            if self._error is not None:
                raise self._failed(f"receiving version {version} failed")
            if not ready:
                raise RuntimeError(f"--weight-transport collective: policy version {version} did not arrive "
                                   f"within {self.timeout_s:g}s (weight group at {self._address})")
            layout, flat = self._kept[version]
        return layout.views(flat)

    def receive(self, handle, engine) -> None:
        if not isinstance(handle, Ticket):
            raise TypeError(f"--weight-transport collective: a rollout received {type(handle).__name__}, not "
                            "a Ticket; the driver and the workers must use the same transport")
        engine.load_weights(self.take(handle.version))

    def forget_older(self, version: int) -> None:
        with self._arrived:
            for old in [v for v in self._kept if v < version]:
                self._keep_spare(self._kept.pop(old)[1])  # the engine copied it: its memory is free

    def connect(self, sender, receivers: list, devices: list[str], resolve) -> str:
        """The driver's start-up step: actor rank 0 (``sender``) opens the group, then every end joins
        it at once (each join waits for the others). ``devices``: where each end's model is, sender
        first; ``resolve``: the driver's bounded ``ray.get``."""
        address = resolve(sender.open_weight_group.remote())
        group = WeightGroup(address, 1 + len(receivers), group_kind(devices))
        resolve([sender.join_weight_group.remote(group, 0)]
                + [r.join_weight_group.remote(group, i + 1) for i, r in enumerate(receivers)])
        return (f"relax: weights: collective broadcast ({group.kind}) from actor rank 0 to "
                f"{len(receivers)} rollout worker(s), group at {address}")
