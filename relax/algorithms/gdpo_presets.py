"""GDPO's presets: subclasses of ``GDPO`` that reproduce a reference implementation exactly.

Each preset class (``GDPONVLabsTRL``, ``GDPONVLabsVerl``) fixes every axis (setting an axis as well
is an error) and uses the reference's own float32 arithmetic in the reference's order of operations. ``--gdpo-preset NAME``
selects it: ``GDPO(config)`` with ``config.gdpo_preset`` set builds the preset's class, so every
process that resolves ``gdpo`` gets the same one.

- ``nvlabs-trl`` (NVlabs ``trl-0.18.0-gdpo`` ``GRPOTrainer``, ``apply_gdpo``): per reward, the
  completions laid out group after group ([groups, G] view), ``(r - mean) / (std + 1e-4)`` with
  torch's unbiased std and no special case; ``sum_k w_k z_k``; then over the whole batch (all ranks'
  completions, as TRL gathers them) ``(a - a.mean()) / (a.std() + 1e-4)``; float32 throughout.
  Deviations: the reference turns NaN rewards into 0 (``nan_to_num``) and sums with ``nansum``;
  here a NaN is rejected with an error naming the sample and key (nothing is silently replaced), so
  the sum is a plain sum. The reference takes this branch only with more than one reward, and views
  the batch as equal groups of G: the preset requires two or more reward keys and equal group sizes.
- ``nvlabs-verl`` (NVlabs ``verl-GDPO``, ``adv_estimator=gdpo``): exactly two rewards (the fork
  hard-codes them), summed without weights. The per-reward step is inferred from the verl release
  the fork is based on, not copied line by line: each reward goes through
  verl's GRPO outcome advantage of that era - per group (members in batch order) float32
  ``(r - mean) / (std + 1e-6)`` with ``torch.std`` (unbiased), a group of one getting mean 0, std 1;
  the two results are added per token; then verl's ``masked_whiten`` over the valid tokens of the
  whole batch: ``mean = sum(x m) / sum(m)``, ``var = sum((x - mean)^2 m) / sum(m) * n / (n - 1)``,
  ``(x - mean) * rsqrt(var + 1e-8)`` (its 1e-8 is part of the formula, not ``--gdpo-std-eps``).
  Positions outside the response mask are 0 here (the reference leaves values there that its loss
  masks out); fewer than two valid tokens is an error, as in verl.

Presets are bit-exact against the references on one process (the advantages service). With
``process_group`` (advantages on the training ranks) the batch is gathered in rank order, so the
statistics see the same numbers in another order: equal up to float32 summation rounding.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from relax.algorithms import numerics
from relax.algorithms.gdpo import GDPO, PRESET_NAMES

_VERL_WHITEN_VAR_EPS = 1e-8  # verl masked_whiten: (x - mean) * rsqrt(var + 1e-8)


class GDPONVLabsTRL(GDPO):
    """GDPO as the NVlabs TRL reference computes it (``--gdpo-preset nvlabs-trl``)."""

    PRESET = "nvlabs-trl"
    AXES: ClassVar[dict] = {
        "gdpo_baseline": "mean",
        "gdpo_std_eps": 1e-4,
        "gdpo_whiten_unit": "sample",
        "gdpo_whiten_scope": "rollout",
        "gdpo_constant_component": "formula",
    }

    @classmethod
    def check_reward_layout(cls, config) -> None:
        if len(config.reward_keys) < 2:
            raise ValueError(
                "gdpo_preset='nvlabs-trl' reproduces the TRL reference's GDPO branch, which it only takes "
                f"with more than one reward; reward_keys has {len(config.reward_keys)} "
                f"({', '.join(config.reward_keys)}). Give --reward-keys at least two components "
                "(e.g. --reward-keys correctness format)"
            )

    def combine_components(self, r, ids):
        return _trl_decoupled(r.to(torch.float32), ids, self.config.reward_weights, self.variant.std_eps)

    def whiten(self, inputs, process_group):
        """The reference's float32 whitening over the whole (gathered) batch, one value per completion."""
        what, values, offset = self._gathered_rewards(inputs, process_group)
        mask = inputs.response_mask.to(torch.bool)
        n = mask.shape[0]
        if values.shape[0] < 2:
            raise ValueError(
                f"{what}: the batch holds {values.shape[0]} sample(s); its std needs at least 2"
            )
        out = (values - values.mean()) / (values.std() + self.variant.std_eps)
        return numerics.broadcast_to_tokens(out[offset:offset + n], mask)


class GDPONVLabsVerl(GDPO):
    """GDPO as the NVlabs verl fork computes it (``--gdpo-preset nvlabs-verl``)."""

    PRESET = "nvlabs-verl"
    AXES: ClassVar[dict] = {
        "gdpo_baseline": "mean",
        "gdpo_std_eps": 1e-6,
        "gdpo_whiten_unit": "token",
        "gdpo_whiten_scope": "rollout",
        "gdpo_constant_component": "formula",
    }

    @classmethod
    def check_reward_layout(cls, config) -> None:
        if len(config.reward_keys) != 2 or config.reward_weights != (1.0, 1.0):
            raise ValueError(
                "gdpo_preset='nvlabs-verl' reproduces the verl reference, which sums exactly two rewards "
                f"without weights; got reward_keys={config.reward_keys} with reward_weights="
                f"{config.reward_weights}. Give exactly two --reward-keys and no --reward-weights (or 1 1)"
            )

    def combine_components(self, r, ids):
        return _verl_decoupled(r.to(torch.float32), ids, self.variant.std_eps)

    def whiten(self, inputs, process_group):
        """verl's ``masked_whiten`` over the valid tokens of the whole (gathered) batch."""
        what, values, offset = self._gathered_rewards(inputs, process_group)
        mask = inputs.response_mask.to(torch.bool)
        n, t = mask.shape
        token_mask, _ = numerics.all_gather_rows(mask.to(torch.float32), process_group, what=what)
        whitened = _verl_masked_whiten(values[:, None] * token_mask, token_mask, what)
        mine = whitened[offset:offset + n, :t]
        return torch.where(mask, mine, mine.new_zeros(()))


GDPO.PRESETS = {cls.PRESET: cls for cls in (GDPONVLabsTRL, GDPONVLabsVerl)}
if tuple(GDPO.PRESETS) != PRESET_NAMES:  # pragma: no cover - guards edits to the classes above
    raise RuntimeError("PRESET_NAMES must list the PRESET of every GDPO preset class")


# ---- presets: the references' own float32 arithmetic, step by step ----


def _batch_order(ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """A permutation laying the batch out group after group (groups by first appearance, members in
    batch order) and the common group size; unequal group sizes -> ``ValueError``."""
    groups = numerics.Groups(ids)
    n = ids.shape[0]
    sizes = groups.counts[groups.counts > 0]
    if n and int(sizes.min()) != int(sizes.max()):
        raise ValueError(
            "--gdpo-preset nvlabs-trl reproduces a reference that views the batch as groups of "
            f"n_samples_per_prompt completions, but the group sizes here range from {int(sizes.min())} to "
            f"{int(sizes.max())}; keep every group whole"
        )
    first = groups.broadcast(groups.first_member())
    order = torch.argsort(first * max(n, 1) + torch.arange(n, device=ids.device), stable=True)
    return order, int(sizes[0]) if n else 1


def _trl_decoupled(r32: torch.Tensor, ids: torch.Tensor, weights, eps: float) -> torch.Tensor:
    """NVlabs TRL steps 1-2 in float32: per reward ``view(-1, G)`` mean/std, z-score, weighted sum."""
    order, g = _batch_order(ids)
    laid_out = r32.index_select(0, order)  # the reference's layout: group after group
    per_reward = []
    for k in range(laid_out.shape[1]):
        column = laid_out[:, k]
        mean = column.view(-1, g).mean(dim=1).repeat_interleave(g, dim=0)
        std = column.view(-1, g).std(dim=1).repeat_interleave(g, dim=0)
        per_reward.append((column - mean) / (std + eps))
    w = torch.tensor(tuple(weights), dtype=torch.float32, device=r32.device)
    combined_laid_out = (torch.stack(per_reward, dim=1) * w.unsqueeze(0)).sum(dim=1)
    return torch.empty_like(combined_laid_out).index_copy_(0, order, combined_laid_out)


def _verl_decoupled(r32: torch.Tensor, ids: torch.Tensor, eps: float) -> torch.Tensor:
    """NVlabs verl steps 1-2 in float32: each reward's GRPO outcome advantage per group, then the sum."""
    combined = torch.zeros(r32.shape[0], dtype=torch.float32, device=r32.device)
    for k in range(r32.shape[1]):
        scores = r32[:, k]
        z = torch.empty_like(scores)
        for gid in torch.unique(ids).tolist():
            members = (ids == gid).nonzero().squeeze(1)
            vals = scores.index_select(0, members)
            if vals.shape[0] == 1:
                mean, std = vals.new_tensor(0.0), vals.new_tensor(1.0)
            else:
                mean, std = torch.mean(vals), torch.std(vals[None, :])
            z[members] = (vals - mean) / (std + eps)
        combined = combined + z  # the reference adds the two token-level advantages
    return combined


def _verl_masked_whiten(values: torch.Tensor, mask: torch.Tensor, what: str) -> torch.Tensor:
    """verl ``masked_whiten`` (shift_mean=True) in float32: unbiased masked variance, rsqrt(var + 1e-8)."""
    count = mask.sum()
    if float(count) < 2:
        raise ValueError(
            f"{what}: the batch holds {int(count)} valid response token(s); verl's masked_whiten needs at least 2"
        )
    mean = (values * mask).sum() / count
    var = ((values - mean) ** 2 * mask).sum() / count
    var = var * (count / (count - 1))
    return (values - mean) * torch.rsqrt(var + _VERL_WHITEN_VAR_EPS)
