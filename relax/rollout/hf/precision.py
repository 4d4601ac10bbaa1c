"""The dtype the transformers engine holds the policy in: a pure function of the run and the device.

bfloat16 when the policy trains in bfloat16 (``--bf16``) and the engine runs on an accelerator (a
CUDA GPU, or any device that is not the CPU): half the memory and the bytes of every weight update,
at a log-prob mismatch with the trainer of order 1e-2, as the vLLM engine with ``--bf16``. On the CPU
the engine stays float32 with or without ``--bf16``: its log-probs then equal the trainer's float32
ones, and a CPU's bfloat16 matrix products are often slower than its float32 ones.
"""

from __future__ import annotations

import torch


def engine_dtype(config, device: str | torch.device) -> torch.dtype:
    """The transformers engine's dtype for ``config`` on ``device`` (see the module's docstring)."""
    on_accelerator = torch.device(device).type != "cpu"
    return torch.bfloat16 if config.bf16 and on_accelerator else torch.float32
