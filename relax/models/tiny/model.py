"""``TinyCausalLM``: the built-in decoder-only transformer (GPT-2 style, ~102k parameters).

Architecture (the Megatron converter relies on it; parameter names are part of the contract):

- token embedding ``tok_emb.weight`` ``[V, d]`` and learned absolute positions ``pos_emb.weight``
  ``[max_seq_len, d]``; the input is their sum;
- ``n_layers`` pre-LN blocks ``blocks.{i}``::

      h = x + attn.o_proj(attention(attn.q_proj(ln1(x)), attn.k_proj(ln1(x)), attn.v_proj(ln1(x))))
      y = h + mlp.fc_out(gelu(mlp.fc_in(ln2(h))))

  ``ln1``/``ln2`` are ``LayerNorm`` (weight and bias, eps 1e-5); every linear has a bias; q/k/v are
  separate ``[d, d]`` projections (head h uses rows ``h*d/H:(h+1)*d/H``), causal softmax attention
  scaled by ``1/sqrt(d/H)``; the MLP hidden width is ``mlp_ratio * d`` with exact (erf) GELU;
- a final ``ln_f`` and logits ``ln_f(x) @ tok_emb.weight.T`` (tied: there is no separate output
  matrix, so ``state_dict`` has no ``lm_head`` entry);
- init: every weight matrix and embedding ~ N(0, 0.02), biases 0, LayerNorm weight 1.

Padding: ``attention_mask`` ``[B, S]`` (True = real token) covers every key position, cached ones
included; ``position_ids`` come from the caller (``TokenBatch.position_ids``: counted from each
row's first real token), so a left-padded row computes exactly what the unpadded row computes.
"""

from __future__ import annotations

import attrs
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


@attrs.frozen(kw_only=True)
class TinyLMConfig:
    vocab_size: int = 17
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    mlp_ratio: int = 4
    max_seq_len: int = 16
    tied_embeddings: bool = True  # the only supported layout; kept explicit for converters
    init_std: float = 0.02

    def __attrs_post_init__(self):
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if not self.tied_embeddings:
            raise ValueError("TinyCausalLM always ties the output matrix to tok_emb (tied_embeddings=True)")

    def to_dict(self) -> dict:
        return attrs.asdict(self)


class KVCache:
    """Preallocated keys/values ``[B, H, capacity, d/H]`` per layer; ``length`` columns are filled."""

    def __init__(self, config: TinyLMConfig, batch_size: int, capacity: int, *, dtype=torch.float32, device=None):
        if capacity > config.max_seq_len:
            raise ValueError(
                f"a KV cache of {capacity} positions exceeds max_seq_len={config.max_seq_len}; shorten the "
                "prompt or max_new_tokens, or build the model with a larger max_seq_len"
            )
        head_dim = config.d_model // config.n_heads
        shape = (batch_size, config.n_heads, capacity, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.n_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.n_layers)]
        self.capacity = capacity
        self.length = 0

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``k, v`` ``[B, H, s, d/H]`` after the filled columns; return all keys/values so far."""
        start, stop = self.length, self.length + k.shape[2]
        if stop > self.capacity:
            raise ValueError(f"KV cache overflow: {stop} positions > capacity {self.capacity}")
        self.keys[layer][:, :, start:stop] = k
        self.values[layer][:, :, start:stop] = v
        return self.keys[layer][:, :, :stop], self.values[layer][:, :, :stop]


class Attention(nn.Module):
    def __init__(self, config: TinyLMConfig):
        super().__init__()
        d = config.d_model
        self.n_heads = config.n_heads
        self.q_proj = nn.Linear(d, d)
        self.k_proj = nn.Linear(d, d)
        self.v_proj = nn.Linear(d, d)
        self.o_proj = nn.Linear(d, d)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        return x.view(b, s, self.n_heads, d // self.n_heads).transpose(1, 2)

    def forward(self, x, allowed: torch.Tensor, layer: int, kv_cache: KVCache | None) -> torch.Tensor:
        q, k, v = self._heads(self.q_proj(x)), self._heads(self.k_proj(x)), self._heads(self.v_proj(x))
        if kv_cache is not None:
            k, v = kv_cache.append(layer, k, v)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        b, h, s, hd = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, s, h * hd))


class MLP(nn.Module):
    def __init__(self, config: TinyLMConfig):
        super().__init__()
        self.fc_in = nn.Linear(config.d_model, config.mlp_ratio * config.d_model)
        self.fc_out = nn.Linear(config.mlp_ratio * config.d_model, config.d_model)

    def forward(self, x):
        return self.fc_out(F.gelu(self.fc_in(x)))


class Block(nn.Module):
    def __init__(self, config: TinyLMConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(config.d_model)
        self.attn = Attention(config)
        self.ln2 = nn.LayerNorm(config.d_model)
        self.mlp = MLP(config)

    def forward(self, x, allowed, layer, kv_cache):
        x = x + self.attn(self.ln1(x), allowed, layer, kv_cache)
        return x + self.mlp(self.ln2(x))


class TinyCausalLM(nn.Module):
    """See the module docstring. ``forward`` returns logits ``[B, s, V]`` (float32), or
    ``(logits, kv_cache)`` when a ``KVCache`` is passed (the cache is filled in place)."""

    def __init__(self, config: TinyLMConfig | None = None):
        super().__init__()
        self.config = config if config is not None else TinyLMConfig()
        c = self.config
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        self.pos_emb = nn.Embedding(c.max_seq_len, c.d_model)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layers))
        self.ln_f = nn.LayerNorm(c.d_model)
        self.gradient_checkpointing = False
        self.reset_parameters()

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None) -> None:
        """Recompute each block's activations in the backward pass (``torch.utils.checkpoint``,
        non-reentrant) while training with gradients; the same call as a transformers model's."""
        self.gradient_checkpointing = True

    def hidden_states(self, input_ids, allowed, position_ids, kv_cache: KVCache | None = None) -> torch.Tensor:
        """The blocks' output after ``ln_f`` ``[B, s, d]`` (``allowed`` from ``_allowed``)."""
        x = self.tok_emb(input_ids) + self.pos_emb(position_ids)
        recompute = self.gradient_checkpointing and self.training and kv_cache is None and torch.is_grad_enabled()
        for layer, block in enumerate(self.blocks):
            if recompute:
                x = checkpoint(block, x, allowed, layer, None, use_reentrant=False)
            else:
                x = block(x, allowed, layer, kv_cache)
        return self.ln_f(x)

    def reset_parameters(self) -> None:
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=self.config.init_std)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
    ):
        b, s = input_ids.shape
        past = kv_cache.length if kv_cache is not None else 0
        total = past + s
        if attention_mask is None:
            attention_mask = torch.ones(b, total, dtype=torch.bool, device=input_ids.device)
        attention_mask = attention_mask.bool()
        if attention_mask.shape != (b, total):
            raise ValueError(
                f"attention_mask must cover cached and new positions: expected shape {(b, total)}, "
                f"got {tuple(attention_mask.shape)}"
            )
        if position_ids is None:
            position_ids = (attention_mask.long().cumsum(1) - 1).clamp(min=0)[:, past:]
        if int(position_ids.max()) >= self.config.max_seq_len:
            raise ValueError(
                f"position {int(position_ids.max())} >= max_seq_len={self.config.max_seq_len}; the "
                "sequence is too long for this TinyCausalLM"
            )
        allowed = self._allowed(attention_mask, past, s)
        logits = self.hidden_states(input_ids, allowed, position_ids, kv_cache) @ self.tok_emb.weight.T
        if kv_cache is None:
            return logits
        kv_cache.length = total
        return logits, kv_cache

    @staticmethod
    def _allowed(attention_mask: torch.Tensor, past: int, s: int) -> torch.Tensor:
        """``[B, 1, s, past+s]``: causal and key is a real token. Each query may also see itself, so
        a padding query never has an empty row (its output is never used)."""
        total = past + s
        device = attention_mask.device
        q_pos = torch.arange(past, total, device=device)[:, None]
        k_pos = torch.arange(total, device=device)[None, :]
        causal = k_pos <= q_pos
        allowed = (causal & attention_mask[:, None, :]) | (k_pos == q_pos)
        return allowed[:, None]
