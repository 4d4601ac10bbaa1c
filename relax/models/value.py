"""Critics: a policy's trunk with a scalar value head (PPO's value model).

Works for the built-in ``TinyCausalLM`` and for transformers ``*ForCausalLM`` models (the head sits
on the decoder's last hidden state instead of the language-model head). Initialized from the
policy's weights, a common PPO choice, with the head at zero so the first values are 0.
"""

from __future__ import annotations

import torch
from torch import nn


def _hidden_size(policy: nn.Module) -> int:
    config = policy.config
    for name in ("d_model", "hidden_size"):
        if hasattr(config, name):
            return int(getattr(config, name))
    raise TypeError(f"cannot find the hidden size of {type(policy).__name__} (no config.d_model / hidden_size)")


class ValueModel(nn.Module):
    """``forward(input_ids, attention_mask, position_ids) -> [N, S]`` values at every position."""

    def __init__(self, policy: nn.Module):
        super().__init__()
        self.trunk = policy
        self.head = nn.Linear(_hidden_size(policy), 1, device=next(policy.parameters()).device)  # beside the trunk
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def _hidden(self, input_ids, attention_mask, position_ids) -> torch.Tensor:
        t = self.trunk
        if hasattr(t, "blocks"):  # TinyCausalLM: everything up to (and including) the final norm
            attention_mask = attention_mask.bool()
            allowed = t._allowed(attention_mask, 0, input_ids.shape[1])
            return t.hidden_states(input_ids, allowed, position_ids)
        decoder = t.get_decoder() if hasattr(t, "get_decoder") else t.base_model
        out = decoder(input_ids=input_ids, attention_mask=attention_mask.long(), position_ids=position_ids,
                      use_cache=False)
        return out.last_hidden_state

    def forward(self, input_ids, attention_mask, position_ids) -> torch.Tensor:
        hidden = self._hidden(input_ids, attention_mask, position_ids)
        return self.head(hidden.to(self.head.weight.dtype)).squeeze(-1)


def response_values(model: ValueModel, batch) -> torch.Tensor:
    """Values ``[N, T]`` of the response positions: V at column ``P + t - 1`` is the value of the
    state before response token ``t`` (the same alignment as the log-probs). Zero where masked."""
    values = model(batch.input_ids, batch.attention_mask, batch.position_ids)
    p, t = batch.prompt_width, batch.response_ids.shape[1]
    return values[:, p - 1 : p + t - 1].float() * batch.response_mask
