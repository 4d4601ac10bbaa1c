"""The supervised loop of the tiny models' warm-ups (``relax.recipes.warmup``,
``relax.recipes.calculator_warmup``): next-token cross-entropy on the masked targets, AdamW.

The order of the seeded draws (torch's seed, the model's initialisation, then the demonstrations'
``random.Random(seed)``) is part of what makes a warm-up reproduce its shipped checkpoint.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import torch
import torch.nn.functional as F

from relax.models.tiny.model import TinyCausalLM, TinyLMConfig

# (rng) -> (ids [n, L], target_mask [n, L - 1]): target t + 1 is predicted from column t.
MakeBatch = Callable[[random.Random], tuple[torch.Tensor, torch.Tensor]]


def train_supervised(config: TinyLMConfig, make_batch: MakeBatch, *, steps: int, lr: float, seed: int) -> TinyCausalLM:
    """A ``TinyCausalLM(config)`` trained for ``steps`` batches of ``make_batch(rng)``."""
    torch.manual_seed(seed)
    model = TinyCausalLM(config)
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    for _ in range(steps):
        ids, mask = make_batch(rng)
        # the batches pad on the right only: causal attention never reaches the padding early
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits[mask], ids[:, 1:][mask])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return model.eval()
