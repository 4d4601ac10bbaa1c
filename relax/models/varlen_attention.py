"""Causal attention over a whole packed row in one fused kernel, on CUDA: torch's variable-length
flash attention (``torch.nn.attention.varlen.varlen_attn``), given the samples' bounds in the row.

The packed forward (``relax.models.packed_forward``) otherwise calls ``sdpa`` once per sample and
layer: exact and cheap in arithmetic, but a micro-batch of 64 samples through 24 layers is some 1,500
small attention calls forward and as many backward, which leaves a GPU waiting on kernel launches.
One varlen call per layer does the same arithmetic (each query attends to the keys of its own sample
up to itself).

The kernel is flash attention: CUDA on an Ampere GPU or newer, half precision (the tensors' own, or
autocast's under ``--bf16``), a head size that is a multiple of 8 up to 256, no attention dropout.
Anything else takes the per-sample path. torch's API is young and its keywords changed between
releases; they are read from the installed function's signature:

- causal: ``is_causal=True`` (torch 2.9-2.10) or ``window_size=(-1, 0)`` (later);
- scale: ``scale=`` where it exists; without it only the default ``1/sqrt(D)`` can be used;
- grouped-query attention: ``enable_gqa=True`` where it exists, else the key/value heads are repeated
  to the query heads (as transformers' eager attention does).
"""

from __future__ import annotations

import functools
import inspect
import math

import torch

HALF = (torch.float16, torch.bfloat16)


@functools.cache
def _kernel():
    """``(varlen_attn, its keyword names)``, or None when this torch has no varlen attention."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn, frozenset(inspect.signature(varlen_attn).parameters)


@functools.cache
def _flash_capable(device_index: int) -> bool:
    """Flash attention's kernels need an Ampere GPU or newer (compute capability 8.0)."""
    return torch.cuda.get_device_capability(device_index) >= (8, 0)


def _half_dtype(query: torch.Tensor) -> torch.dtype | None:
    """The half-precision dtype attention runs in: the query's own, or autocast's. Under ``--bf16``
    autocast the rotary embedding (float32 cos/sin) hands attention float32 queries and keys, which
    ``sdpa`` would cast to bf16 itself."""
    if query.dtype in HALF:
        return query.dtype
    device = query.device.type
    if torch.is_autocast_enabled(device) and torch.get_autocast_dtype(device) in HALF:
        return torch.get_autocast_dtype(device)
    return None


def usable(query: torch.Tensor, dropout: float, scaling: float | None) -> bool:
    """Whether one varlen call can replace the per-sample calls for ``query`` ``[1, H, L, D]``."""
    kernel = _kernel()
    if kernel is None or not query.is_cuda or _half_dtype(query) is None or dropout:
        return False
    if not _flash_capable(query.device.index or 0):
        return False
    head_dim, names = query.shape[-1], kernel[1]
    if head_dim % 8 or head_dim > 256:
        return False
    if not ({"is_causal", "window_size"} & names):
        return False
    return "scale" in names or scaling is None or math.isclose(scaling, head_dim ** -0.5)


def causal_varlen_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            cu_seqlens: torch.Tensor, max_len: int, scaling: float | None) -> torch.Tensor:
    """transformers' layout in and out: ``query`` ``[1, H, L, D]``, ``key``/``value`` ``[1, H_kv, L, D]``
    -> ``[1, L, H, D]``; ``cu_seqlens`` ``[n + 1]`` int32 on the row's device, ``max_len`` the longest
    sample. Call only where ``usable``."""
    varlen_attn, names = _kernel()
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [L, heads, D], strided
    kwargs = {"is_causal": True} if "is_causal" in names else {"window_size": (-1, 0)}
    if "scale" in names and scaling is not None:
        kwargs["scale"] = scaling
    if k.shape[1] != q.shape[1]:
        if "enable_gqa" in names:
            kwargs["enable_gqa"] = True
        else:
            groups = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    dtype = _half_dtype(query) or query.dtype
    q, k, v = (t.to(dtype).contiguous() for t in (q, k, v))
    out = varlen_attn(q, k, v, cu_seqlens, cu_seqlens, max_len, max_len, **kwargs)
    return out.unsqueeze(0)
