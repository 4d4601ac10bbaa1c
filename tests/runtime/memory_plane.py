"""An in-memory stand-in for the TransferQueue data plane (same five methods), for tests of the
roles' logic without Ray. It keeps whole groups too and honours the requested group order."""

from __future__ import annotations

import torch

from relax.runtime.data_plane import StepBatch, group_rows


class _Meta:
    def __init__(self, step, uids):
        self.step, self.uids, self.size = step, list(uids), len(uids)


class MemoryDataPlane:
    def __init__(self):
        self.steps: dict[int, dict] = {}
        self.cleared: list[int] = []

    def put_step(self, step, fields, group_uids):
        uids, order = group_rows(group_uids)
        self.steps[step] = {"order": uids, "groups": {u: {k: v[order[i]] for k, v in fields.items()}
                                                       for i, u in enumerate(uids)}}
        return len(uids)

    def read(self, step, fields, task, num_groups, group_uids=None):
        if num_groups == 0:
            return StepBatch({f: torch.empty(0) for f in fields}, None)
        part = self.steps[step]
        uids = part["order"] if group_uids is None else list(group_uids)
        assert len(uids) == num_groups
        out = {f: torch.cat([part["groups"][u][f] for u in uids]) for f in fields}
        return StepBatch(out, _Meta(step, uids))

    def add_fields(self, batch, fields):
        part = self.steps[batch.meta.step]
        g = next(iter(fields.values())).shape[0] // batch.meta.size
        for i, u in enumerate(batch.meta.uids):
            for k, v in fields.items():
                part["groups"][u][k] = v[i * g:(i + 1) * g]

    def clear(self, step):
        self.steps.pop(step, None)
        self.cleared.append(step)
