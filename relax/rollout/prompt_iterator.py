"""``PromptIterator``: the endless, resumable walk over a data set's prompts.

It walks the data set epoch after epoch, in a fresh order per epoch derived only from
``(seed, epoch)``, so its whole state is ``{epoch, position}`` and a resumed run draws exactly the
prompts the interrupted run would have drawn.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping, Sequence

from relax.rollout.base import Prompt


class PromptIterator:
    """Endless, resumable walk over a data set: epoch after epoch, each in its own seeded order.

    ``state_dict()`` is ``{"epoch", "position", "seed", "num_prompts"}``; loading it into an
    iterator over the same data and seed continues exactly where the saved one stopped.
    """

    def __init__(self, prompts: Sequence[Prompt], *, seed: int = 1234, shuffle: bool = True):
        if len(prompts) == 0:
            raise ValueError("PromptIterator needs at least one prompt")
        self.prompts = prompts
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.position = 0
        self._order = self._order_of(0)

    def _order_of(self, epoch: int) -> list[int]:
        order = list(range(len(self.prompts)))
        if self.shuffle:
            # Depends only on (seed, epoch): resuming needs no RNG state.
            random.Random(f"relax-prompts/{self.seed}/{epoch}").shuffle(order)
        return order

    def __iter__(self) -> Iterator[Prompt]:
        return self

    def __next__(self) -> Prompt:
        if self.position >= len(self._order):
            self.epoch += 1
            self.position = 0
            self._order = self._order_of(self.epoch)
        prompt = self.prompts[self._order[self.position]]
        self.position += 1
        return prompt

    def next_batch(self, n: int) -> list[Prompt]:
        """The next ``n`` prompts (continuing into the next epoch when this one runs out)."""
        return [next(self) for _ in range(n)]

    def state_dict(self) -> dict[str, int]:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "num_prompts": len(self.prompts),
        }

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        if state.get("num_prompts") != len(self.prompts) or state.get("seed") != self.seed:
            raise ValueError(
                f"cannot resume the prompt iterator: the checkpoint was saved with {state.get('num_prompts')} "
                f"prompts and seed {state.get('seed')}, this run has {len(self.prompts)} prompts and seed "
                f"{self.seed} (same --prompt-data, --max-prompt-len and --seed are needed to resume)"
            )
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self._order = self._order_of(self.epoch)
