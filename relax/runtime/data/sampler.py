"""A TransferQueue sampler that hands out whole prompt groups, chosen by group uid.

TransferQueue's ``GRPOGroupNSampler`` assumes that a prompt's samples have consecutive global
indexes and cuts the ready list into runs of n, which mixes prompts as soon as one sample is late or
indexes are recycled after a clear. This sampler instead reads the group uid every sample carries in
its ``custom_meta`` and returns exactly the groups the caller asked for, and only when every sample
of every requested group is ready.

It runs inside the TransferQueue controller actor (pickled there), so it imports only the stdlib and
TransferQueue's base class (and relax's stdlib-only environment defaults and import hook).
"""

from __future__ import annotations

from typing import Any

from relax.runtime.data import lazy_dynamo
from relax.runtime.data.environment import apply_environment_defaults

# TransferQueue reads TQ_NUM_THREADS once, at import; this is the first place relax imports it.
apply_environment_defaults()
lazy_dynamo.install()  # before tensordict's import (relax.runtime.data.lazy_dynamo says why)

from transfer_queue.sampler import BaseSampler

GROUP_UID = "group_uid"  # custom_meta key: the prompt group of a sample (int, unique within a step)
GROUP_SIZE = "group_size"  # custom_meta key: how many samples the group has in this partition
SAMPLE_INDEX = "sample_index"  # custom_meta key: write position of the sample in its partition


def select_groups(
    ready: list[int], custom_meta: dict[int, dict], uids: list[int] | None
) -> tuple[list[int], list[int]]:
    """Pick the ready samples of the requested groups, all of them or nothing.

    ``uids`` None means every group whose samples are all ready, in write order. Returns
    ``(sampled, missing_uids)``: ``sampled`` in the order of ``uids`` (each group in write order),
    empty when any requested group is incomplete; ``missing_uids`` lists the requested groups that
    are not complete yet.
    """
    by_uid: dict[int, list[tuple[int, int]]] = {}
    expected: dict[int, int] = {}
    for index in ready:
        meta = custom_meta.get(index)
        if meta is None or GROUP_UID not in meta:
            continue  # not written through the data plane (no group): never handed out as a group
        uid = meta[GROUP_UID]
        by_uid.setdefault(uid, []).append((meta.get(SAMPLE_INDEX, index), index))
        expected[uid] = meta[GROUP_SIZE]
    wanted = sorted(by_uid, key=lambda u: min(by_uid[u])) if uids is None else list(uids)
    missing = [u for u in wanted if len(by_uid.get(u, ())) != expected.get(u, -1)]
    if uids is None:
        wanted = [u for u in wanted if u not in missing]
        missing = []
    if missing:
        return [], missing
    sampled = [index for u in wanted for _, index in sorted(by_uid[u])]
    return sampled, []


class PromptGroupSampler(BaseSampler):
    """Hands out whole prompt groups by uid (see module docstring).

    ``sampling_config`` keys: ``group_uids`` (list of uids, or absent for every complete group).
    The returned samples are also marked consumed for the calling task.
    """

    def sample(self, ready_indexes: list[int], batch_size: int, *args: Any, **kwargs: Any):
        partition = kwargs.get("partition")
        uids = kwargs.get("group_uids")
        custom_meta = partition.get_custom_meta(list(ready_indexes)) if partition is not None else {}
        sampled, _missing = select_groups(list(ready_indexes), custom_meta, uids)
        return sampled, list(sampled)
