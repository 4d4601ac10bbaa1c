"""The data plane in one process's memory: the same five methods as ``TransferQueueDataPlane``.

For the roles' cores when they run in one process (``--in-process``, tests): groups are
kept whole, a read returns the requested groups in the requested order (write order without
``group_uids``), and rows written by different puts are padded to one width exactly as the
TransferQueue read pads them (``relax.runtime.data.data_plane._pad_widths``), so a step reads the same
tensors here as through TransferQueue.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from relax.runtime.data.data_plane import StepBatch, _pad_widths, group_rows


class _Read:
    """The handle a read returns (``StepBatch.meta``): which groups, in which order."""

    def __init__(self, step: int, uids: Sequence[int]):
        self.step, self.uids, self.size = step, list(uids), len(uids)


class MemoryDataPlane:
    def __init__(self):
        self.steps: dict[int, dict] = {}  # step -> {"order": [uid, ...], "groups": {uid: {field: [G, ...]}}}
        self.cleared: list[int] = []

    def put_step(self, step: int, fields: Mapping[str, torch.Tensor], group_uids: torch.Tensor) -> int:
        if int(group_uids.shape[0]) == 0:
            return 0
        uids, order = group_rows(group_uids)
        part = self.steps.setdefault(step, {"order": [], "groups": {}})
        for i, uid in enumerate(uids):
            part["order"].append(uid)
            part["groups"][uid] = {name: value[order[i]] for name, value in fields.items()}
        return len(uids)

    def read(self, step: int, fields: Sequence[str], task: str, num_groups: int,
             group_uids: Sequence[int] | None = None) -> StepBatch:
        if group_uids is not None and len(group_uids) != num_groups:
            raise ValueError(f"num_groups={num_groups} but {len(group_uids)} group uids requested")
        if num_groups == 0:
            return StepBatch({name: torch.empty(0) for name in fields}, None)
        part = self.steps[step]
        uids = part["order"][:num_groups] if group_uids is None else list(group_uids)
        out = {}
        for name in fields:
            groups = [part["groups"][u][name] for u in uids]
            if all(g.shape == groups[0].shape for g in groups):
                out[name] = torch.stack(groups).flatten(0, 1)
            else:  # groups from puts of different widths
                out[name] = _pad_widths(groups, name).flatten(0, 1)
        return StepBatch(out, _Read(step, uids))

    def add_fields(self, batch: StepBatch, fields: Mapping[str, torch.Tensor]) -> None:
        if batch.num_groups == 0:
            return
        part = self.steps[batch.meta.step]
        for name, value in fields.items():
            rows = value.reshape(batch.num_groups, -1, *value.shape[1:])
            for i, uid in enumerate(batch.meta.uids):
                part["groups"][uid][name] = rows[i]

    def clear(self, step: int) -> None:
        self.steps.pop(step, None)
        self.cleared.append(step)

    def clear_steps(self) -> None:
        for step in list(self.steps):
            self.clear(step)
