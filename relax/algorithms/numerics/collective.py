"""Collectives over an optional ``process_group`` and the every-rank-raises rule.

Every rank reaches every collective. A problem found on one rank is folded into a collective that
all ranks run anyway, and then all ranks raise together; raising before a collective would leave
the other ranks waiting forever.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from relax.algorithms.numerics.checks import first_non_finite


def _all_reduce(t: torch.Tensor, op, process_group) -> torch.Tensor:
    if process_group is not None:
        dist.all_reduce(t, op=op, group=process_group)
    return t


def raise_on_all_ranks(local_message: str | None, process_group, what: str, device=None) -> None:
    """One MAX all-reduce of an error flag; every rank raises ``ValueError`` if any rank had a problem.

    The rank at fault raises its own message; the others say that another rank reported ``what``.
    """
    flag = torch.tensor([1.0 if local_message else 0.0], dtype=torch.float64, device=device)
    _all_reduce(flag, dist.ReduceOp.MAX, process_group)
    if float(flag[0]) > 0:
        raise ValueError(
            local_message or f"another rank in the process group reported {what}; see its error message"
        )


def _non_finite_message(values, mask, what: str) -> str | None:
    where = first_non_finite(values, mask)
    if where is None:
        return None
    pos = f"sample {where[0]}" + (f", token {where[1]}" if len(where) > 1 else "")
    return (
        f"{what} received a non-finite value {values[where].item()!r} at {pos} (on this rank). Check the "
        "rewards / values feeding it; non-finite numbers are never replaced silently."
    )


def check_finite(values: torch.Tensor, mask: torch.Tensor | None = None, process_group=None, *, what: str) -> None:
    """Raise ``ValueError`` on every rank if any rank holds a non-finite (valid) value. One collective."""
    message = _non_finite_message(values, None if mask is None else mask.to(torch.bool), what)
    raise_on_all_ranks(message, process_group, f"a non-finite value for {what}", device=values.device)


def all_gather_rows(
    local: torch.Tensor, process_group=None, *, error: str | None = None, what: str = "all_gather_rows"
) -> tuple[torch.Tensor, int]:
    """Concatenate every rank's ``[n_r]`` or ``[n_r, t_r]`` tensor along dim 0, in rank order.

    -> ``(whole, offset)`` with ``whole[offset:offset + n]`` this rank's rows. 2-D pieces of different
    widths are right-padded with zeros to the widest. ``error`` (a message found on this rank) is
    agreed on in the first collective and raised on every rank. Without a group: ``(local, 0)``.
    """
    if process_group is None:
        if error:
            raise ValueError(error)
        return local, 0
    world, rank = dist.get_world_size(process_group), dist.get_rank(process_group)
    width = local.shape[1] if local.dim() == 2 else 0
    shapes = torch.zeros(world, 3, dtype=torch.int64, device=local.device)
    shapes[rank] = torch.tensor([local.shape[0], width, 1 if error else 0], device=local.device)
    _all_reduce(shapes, dist.ReduceOp.SUM, process_group)
    if int(shapes[:, 2].max()):
        raise ValueError(error or f"another rank in the process group reported a problem with {what}; "
                         "see its error message")
    rows, t_max = int(shapes[:, 0].max()), int(shapes[:, 1].max())
    padded = local.new_zeros((rows, t_max) if local.dim() == 2 else (rows,))
    if local.dim() == 2:
        padded[: local.shape[0], : local.shape[1]] = local
    else:
        padded[: local.shape[0]] = local
    pieces = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(pieces, padded, group=process_group)
    whole = torch.cat([p[: int(shapes[r, 0])] for r, p in enumerate(pieces)])
    return whole, int(shapes[:rank, 0].sum())
