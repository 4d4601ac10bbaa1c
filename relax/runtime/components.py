"""What each worker builds from a ``RunConfig``: models, engine, prompt source, reward function.

The embedded default (no ``--hf-checkpoint``): the shipped warm-up ``TinyCausalLM``, its tokenizer
and ``TinyEngine``, and the built-in ``--task``. With ``--hf-checkpoint`` the transformers factory
of ``relax.rollout.hf`` is used instead. Every worker calls these with the same config, so they all
start from the same weights without sending them around.
"""

from __future__ import annotations

import torch
from torch import nn


def reward_setup(config):
    """-> ``(reward_fn, reward_keys)``: ``--custom-rm-path`` if given, else the task's."""
    from relax.rollout.tasks import get_task

    keys = tuple(config.algorithm.reward_keys)
    if config.custom_rm_path:
        from relax.rollout.rewards import load_reward_function

        return load_reward_function(config.custom_rm_path), keys
    return get_task(config.task).reward_fn, keys


def build_engine(config):
    """The rollout's generation engine (it owns a copy of the policy weights)."""
    if config.hf_checkpoint:
        from relax.rollout.hf.factory import hf_engine_from_config

        return hf_engine_from_config(config)
    from relax.rollout.tasks import get_task

    return get_task(config.task).make_engine()


def build_prompt_source(config, tokenizer):
    """A resumable prompt source with ``next_batch(n)``, ``state_dict()`` and ``load_state_dict()``."""
    if config.prompt_data:
        from relax.rollout.data import prompt_iterator_from_config

        return prompt_iterator_from_config(config, tokenizer)
    from relax.rollout.tasks import get_task

    return get_task(config.task).make_prompts(config.seed)


def build_policy_model(config) -> nn.Module:
    """The trainable policy, initialized exactly like the rollout engine's copy."""
    if config.hf_checkpoint:
        from relax.rollout.hf.factory import hf_policy_model

        return hf_policy_model(config)
    from relax.rollout.tiny.warmup import load_warmup_model

    return load_warmup_model()


def build_reference_model(config) -> nn.Module:
    """The frozen reference policy (``--ref-load``, else the initial policy)."""
    if config.hf_checkpoint:
        from relax.rollout.hf.factory import hf_reference_model

        model = hf_reference_model(config)
    else:
        from relax.rollout.tiny.warmup import load_warmup_model

        model = load_warmup_model(config.ref_load) if config.ref_load else load_warmup_model()
    model.requires_grad_(False)
    return model.eval()


def forward_logits_fn(config):
    if config.hf_checkpoint:
        from relax.rollout.hf.adapter import hf_forward_logits

        return hf_forward_logits
    from relax.backends.torch_backend import default_forward_logits

    return default_forward_logits


class ValueModel(nn.Module):
    """A critic: the policy's transformer trunk with a scalar head on the last hidden state.

    For the built-in ``TinyCausalLM`` the trunk is everything up to ``ln_f``; the head replaces the
    tied output matrix. Initialized from the policy weights (a common PPO choice), head zero.
    """

    def __init__(self, policy: nn.Module):
        super().__init__()
        if not hasattr(policy, "blocks"):
            raise NotImplementedError(
                "the PPO critic is implemented for the built-in TinyCausalLM; a transformers critic is not "
                "supported yet (use a critic-free algorithm such as grpo/gdpo with --hf-checkpoint)"
            )
        self.trunk = policy
        self.head = nn.Linear(policy.config.d_model, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, input_ids, attention_mask, position_ids) -> torch.Tensor:
        t = self.trunk
        attention_mask = attention_mask.bool()
        allowed = t._allowed(attention_mask, 0, input_ids.shape[1])
        x = t.tok_emb(input_ids) + t.pos_emb(position_ids)
        for layer, block in enumerate(t.blocks):
            x = block(x, allowed, layer, None)
        return self.head(t.ln_f(x)).squeeze(-1)  # [N, S]


def response_values(model: ValueModel, batch) -> torch.Tensor:
    """Values ``[N, T]`` of the response positions: V at column ``P + t - 1`` is the value of the
    state before response token ``t`` (the same alignment as the log-probs). Zero where masked."""
    values = model(batch.input_ids, batch.attention_mask, batch.position_ids)
    p, t = batch.prompt_width, batch.response_ids.shape[1]
    return values[:, p - 1 : p + t - 1].float() * batch.response_mask
