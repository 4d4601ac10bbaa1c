"""The model families the Megatron backend trains, each as a small adapter the backend takes.

``MegatronBackend`` trains a megatron-core ``GPTModel`` but speaks the rollout engine's parameter
names at its edges: the initial weights, ``export_weights`` (what the rollout loads and what every
save writes), the model and Adam tensors of its checkpoints. What differs between families is only
how the ``GPTModel`` is configured and how its (sharded) tensors map to those names, so each family
answers exactly that, and the backend itself never branches on the family:

- ``TinyFamily``: the built-in ``TinyCausalLM`` (``relax.backends.megatron.model``);
- ``HFFamily``: a Hugging Face Llama / Qwen2 / Qwen3 dense checkpoint (``relax.backends.megatron.hf_model``
  builds it, ``hf_convert`` maps its weights), exported in the HF module's ``state_dict`` names.

Every family has ``config`` (with ``vocab_size``), ``describe()`` (a plain dict, stored in and
compared against checkpoints), ``transformer_config`` / ``build`` (this rank's ``GPTModel``),
``default_weights`` (weights when the caller gives none), ``load_into`` (the family's whole weights
into this rank's Megatron tensors, in place) and ``gather`` (every rank's tensors back to the
family's whole weights; a collective over the tensor- and pipeline-parallel groups).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from relax.backends.megatron import hf_convert, hf_model
from relax.backends.megatron import model as tiny
from relax.models.tiny.model import TinyCausalLM, TinyLMConfig


class TinyFamily:
    """The built-in ``TinyCausalLM`` (LayerNorm, GELU, learned positions, tied embeddings)."""

    def __init__(self, config: TinyLMConfig):
        self.config = config

    def describe(self) -> dict:
        return self.config.to_dict()

    def transformer_config(self, *, tp_size: int, pp_size: int, **overrides):
        return tiny.transformer_config(self.config, tp_size=tp_size, pp_size=pp_size, **overrides)

    def build(self, config, *, pre_process: bool, post_process: bool):
        return tiny.build_gpt_model(self.config, config, pre_process=pre_process, post_process=post_process)

    def default_weights(self, seed: int) -> dict[str, torch.Tensor]:
        """The torch backend's initialization: ``TinyCausalLM`` built after ``torch.manual_seed(seed)``."""
        torch.manual_seed(seed)
        return TinyCausalLM(self.config).state_dict()

    def load_into(self, targets, weights: Mapping[str, torch.Tensor], *, tp_rank: int, tp_size: int,
                  layer_offset: int) -> None:
        full = tiny.tiny_to_megatron(weights, self.config, tp_size=tp_size)
        tiny.shard_full_state(full, targets, tp_rank=tp_rank, tp_size=tp_size, layer_offset=layer_offset)

    def gather(self, local, *, tp_group, pp_group, layer_offset: int) -> dict[str, torch.Tensor]:
        full = tiny.gather_full_state(local, tp_group=tp_group, pp_group=pp_group, layer_offset=layer_offset)
        return tiny.megatron_to_tiny(full, self.config)


class HFFamily:
    """A Hugging Face Llama / Qwen2 / Qwen3 dense model, by its ``transformers`` config. Unsupported
    configs (another ``model_type``, ``rope_scaling``) raise ``ValueError`` here, naming the fix."""

    def __init__(self, hf_config):
        self.config = hf_config
        self.dims = hf_model.model_dims(hf_config)

    def describe(self) -> dict:
        return {"hf": dict(self.dims), "rope_theta": hf_model.rope_theta(self.config),
                "rms_norm_eps": float(self.config.rms_norm_eps)}

    def transformer_config(self, *, tp_size: int, pp_size: int, **overrides):
        return hf_model.hf_transformer_config(self.config, tp_size=tp_size, pp_size=pp_size, **overrides)

    def build(self, config, *, pre_process: bool, post_process: bool):
        return hf_model.build_hf_gpt_model(self.config, config, pre_process=pre_process, post_process=post_process)

    def default_weights(self, seed: int) -> dict[str, torch.Tensor]:
        raise ValueError("a Hugging Face model starts from its checkpoint's weights: pass initial_weights")

    def load_into(self, targets, weights: Mapping[str, torch.Tensor], *, tp_rank: int, tp_size: int,
                  layer_offset: int) -> None:
        hf_convert.load_hf_state_into(targets, weights, self.config, tp_rank=tp_rank, tp_size=tp_size,
                                      layer_offset=layer_offset)

    def gather(self, local, *, tp_group, pp_group, layer_offset: int) -> dict[str, torch.Tensor]:
        return hf_convert.gather_hf_state(local, self.config, tp_group=tp_group, pp_group=pp_group,
                                          layer_offset=layer_offset)


ModelFamily = TinyFamily | HFFamily


def family_of(model) -> ModelFamily:
    """The family adapter for the policy ``model`` that the runtime built (``build_policy_model``)."""
    if isinstance(model, TinyCausalLM):
        return TinyFamily(model.config)
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "model_type"):  # a transformers model
        return HFFamily(config)  # raises for an architecture the converter does not map
    raise ValueError(
        f"--backend megatron trains the built-in TinyCausalLM or a Hugging Face Llama / Qwen2 / Qwen3 "
        f"checkpoint (--hf-checkpoint), not a {type(model).__name__}; use --backend torch for it"
    )
