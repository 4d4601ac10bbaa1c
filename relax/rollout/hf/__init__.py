"""Hugging Face checkpoints: loading from local directories, KV-cached generation with sampling
log-probs (``HFEngine``), the ``TorchBackend`` adapter and ``save_pretrained`` checkpoints.

Needs ``transformers`` (the ``hf`` extra); importing this package does not import it until a
loader runs.
"""

from relax.rollout.hf.adapter import hf_forward_logits
from relax.rollout.hf.checkpoint import export_hf_checkpoint, save_hf_checkpoint
from relax.rollout.hf.engine import HFEngine, load_hf_state_dict, top_p_filter
from relax.rollout.hf.factory import hf_engine_from_config, hf_policy_model, hf_reference_model
from relax.rollout.hf.loading import HFTokenizer, check_checkpoint_dir, load_hf_model, load_hf_tokenizer

__all__ = [
    "HFEngine",
    "HFTokenizer",
    "check_checkpoint_dir",
    "export_hf_checkpoint",
    "hf_engine_from_config",
    "hf_forward_logits",
    "hf_policy_model",
    "hf_reference_model",
    "load_hf_model",
    "load_hf_state_dict",
    "load_hf_tokenizer",
    "save_hf_checkpoint",
    "top_p_filter",
]
