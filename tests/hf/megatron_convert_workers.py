"""Rank functions for ``test_megatron_convert.py`` (module level, so spawn can pickle them)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
from tiny_checkpoints import model_config

VOCAB = 47  # odd on purpose: with tp=2 Megatron pads the vocab to 48


def random_hf_model(family: str, tie: bool):
    """A random HF model whose norm weights and biases are not 1 / 0 (a conversion that swapped or
    dropped them would otherwise still match)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = model_config(family, VOCAB, tie=tie)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2 + (1.0 if p.dim() == 1 else 0.0))
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return cfg, model


def padded_batch():
    """Left-padded rows of different lengths (the ``TokenBatch`` layout): ids, mask, positions."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, VOCAB, (3, 9), generator=g)
    mask = torch.ones(3, 9, dtype=torch.bool)
    mask[1, :3] = False
    mask[2, :5] = False
    ids[~mask] = 0
    positions = (mask.long().cumsum(1) - 1).clamp(min=0)
    return ids, mask, positions


def megatron_mask(mask: torch.Tensor) -> torch.Tensor:
    """Causal + key padding, every query sees itself; Megatron masks where True."""
    s = mask.shape[1]
    idx = torch.arange(s)
    allowed = ((idx[None, :] <= idx[:, None]) & mask[:, None, :]) | torch.eye(s, dtype=torch.bool)
    return ~allowed[:, None]


def convert_and_compare(rank: int, world: int, cases) -> dict:
    """For each (family, tie): HF logits vs the converted Megatron model's logits (gathered over tp),
    and the Megatron weights gathered back to HF names."""
    from relax.backends.megatron import _cpu_compat
    from relax.backends.megatron.hf_convert import gather_hf_state, load_hf_state_into
    from relax.backends.megatron.hf_model import build_hf_gpt_model, hf_transformer_config
    from relax.backends.megatron.process_groups import init_parallel_state

    _cpu_compat.apply()
    init_parallel_state(world, 1, 0)
    results = {}
    ids, mask, positions = padded_batch()
    for family, tie in cases:
        cfg, hf = random_hf_model(family, tie)
        with torch.no_grad():
            ref = hf(input_ids=ids, attention_mask=mask.long(), position_ids=positions).logits
        group = dist.group.WORLD
        with _cpu_compat.cpu_device_scope():
            mg = build_hf_gpt_model(cfg, hf_transformer_config(cfg, tp_size=world)).eval()
            local = mg.state_dict()
            load_hf_state_into(local, hf.state_dict(), cfg, tp_rank=rank, tp_size=world)
            with torch.no_grad():
                logits = mg(ids, positions, megatron_mask(mask))
        # Gather the vocab-parallel logits and every weight shard back.
        parts = [torch.empty_like(logits) for _ in range(world)]
        dist.all_gather(parts, logits.contiguous())
        round_trip = gather_hf_state(local, cfg, tp_group=group if world > 1 else None)
        results[(family, tie)] = {
            "ref": ref,
            "megatron": torch.cat(parts, dim=-1)[..., :VOCAB],
            "mask": mask,
            "hf_state": {k: v.detach().clone() for k, v in hf.state_dict().items()},
            "round_trip": round_trip,
        }
    return results
