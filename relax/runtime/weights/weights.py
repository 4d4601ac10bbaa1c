"""New weights from actor rank 0 to the rollout, as one contiguous byte buffer.

Ray serializes a dict of tensors tensor by tensor; one numpy byte array travels zero-copy through
the object store instead. Measured on 2 cores for the default ~100k-parameter model (36 tensors,
400 KB), actor -> actor hop: 6.5 ms as a dict, 3.3 ms packed (1.3 ms with no payload). Packing and
unpacking copy bytes only, so the weights arrive bit for bit.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs
import numpy as np
import torch

_ALIGN = 16  # every tensor starts at a multiple of this, so a byte slice can be viewed as its dtype


@attrs.frozen
class PackedWeights:
    names: tuple[str, ...]
    dtypes: tuple[torch.dtype, ...]
    shapes: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]  # byte offset of each tensor in ``buffer``
    buffer: np.ndarray  # uint8

    def unpack(self) -> dict[str, torch.Tensor]:
        """Tensors viewing the buffer (no copy; ``load_state_dict`` copies them into the model)."""
        # Ray hands the buffer over read-only (zero-copy from the object store): copy it once
        # (0.4 MB for the default model) rather than give the engine tensors it must not write.
        buffer = self.buffer if self.buffer.flags.writeable else self.buffer.copy()
        layout = WeightsLayout(self.names, self.dtypes, self.shapes, self.offsets, int(buffer.size))
        return layout.views(torch.from_numpy(buffer))


@attrs.frozen
class WeightsLayout:
    """Where each tensor of a packed buffer lies: what a receiver needs besides the bytes."""

    names: tuple[str, ...]
    dtypes: tuple[torch.dtype, ...]
    shapes: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]  # byte offset of each tensor in the buffer
    nbytes: int  # the buffer's length

    def views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Tensors viewing ``flat`` (a uint8 tensor of ``nbytes``, on any device; no copy)."""
        out = {}
        for name, dtype, shape, start in zip(self.names, self.dtypes, self.shapes, self.offsets):
            size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            out[name] = flat[start:start + size].view(dtype).view(shape)
        return out


def pack_flat(weights: Mapping[str, torch.Tensor], device: torch.device | str = "cpu",
              reuse=None) -> tuple[WeightsLayout, torch.Tensor]:
    """Every tensor of ``weights`` copied byte for byte into one contiguous uint8 tensor on ``device``.
    ``reuse(nbytes)``: a spare buffer of that size to copy into, or None (a new one is allocated)."""
    names, dtypes, shapes, offsets, parts = [], [], [], [], []
    position = 0
    for name, tensor in weights.items():
        t = tensor.detach().to(device).contiguous()
        raw = t.reshape(-1).view(torch.uint8)
        names.append(name)
        dtypes.append(t.dtype)
        shapes.append(tuple(t.shape))
        offsets.append(position)
        parts.append(raw)
        padding = -raw.numel() % _ALIGN
        if padding:
            parts.append(torch.zeros(padding, dtype=torch.uint8, device=device))
        position += raw.numel() + padding
    spare = reuse(position) if reuse is not None and parts else None
    if spare is not None:
        flat = torch.cat(parts, out=spare)
    else:
        flat = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.uint8, device=device)
    return WeightsLayout(tuple(names), tuple(dtypes), tuple(shapes), tuple(offsets), position), flat


def pack_weights(weights: Mapping[str, torch.Tensor]) -> PackedWeights:
    """One contiguous CPU byte buffer holding every tensor of ``weights``."""
    layout, flat = pack_flat(weights)
    return PackedWeights(layout.names, layout.dtypes, layout.shapes, layout.offsets, flat.numpy())


def unpack_weights(weights):
    """``PackedWeights`` -> dict of tensors; a plain mapping (or None) passes through."""
    return weights.unpack() if isinstance(weights, PackedWeights) else weights
