"""A step of samples written to the in-memory data plane on the CPU, as a rollout writes it, for the
roles' cores to read: random tokens with ragged prompt and response lengths (so packing and masks
matter) and rewards that differ inside every group."""

from __future__ import annotations

import torch

from relax.runtime.data.memory_plane import MemoryDataPlane
from relax.runtime.step.schedule import StepPlan, plan_step


def write_step(plane: MemoryDataPlane, step: int, *, groups: int = 4, group_size: int = 4, vocab: int = 17,
               prompt_width: int = 5, response_width: int = 7, seed: int = 0,
               rollout_log_probs: bool = False, num_minibatches: int = 2) -> StepPlan:
    """Write ``groups`` prompt groups of ``group_size`` samples at ``step``; returns the step's plan."""
    g = torch.Generator().manual_seed(seed)
    n = groups * group_size
    prompt_len = torch.randint(2, prompt_width + 1, (n,), generator=g)
    response_len = torch.randint(1, response_width + 1, (n,), generator=g)
    prompt_mask = torch.arange(prompt_width)[None, :] >= (prompt_width - prompt_len)[:, None]  # left-padded
    response_mask = torch.arange(response_width)[None, :] < response_len[:, None]  # right-padded
    fields = {
        "prompt_ids": torch.randint(3, vocab, (n, prompt_width), generator=g) * prompt_mask,
        "prompt_mask": prompt_mask,
        "response_ids": torch.randint(3, vocab, (n, response_width), generator=g) * response_mask,
        "response_mask": response_mask,
        "rewards": torch.rand(n, generator=g),  # the normalized scalar reward
    }
    if rollout_log_probs:
        fields["rollout_log_probs"] = -torch.rand((n, response_width), generator=g) * 3 * response_mask
    uids = [step * 100 + i for i in range(groups)]
    plane.put_step(step, fields, torch.tensor(uids).repeat_interleave(group_size))
    tokens = response_mask.sum(1).view(groups, group_size).sum(1).tolist()
    return plan_step(uids, tokens, group_size, num_minibatches, 1)
