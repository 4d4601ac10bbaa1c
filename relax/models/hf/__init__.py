"""Hugging Face causal LMs: loading local checkpoints and tokenizers, the forward adapter used by
the trainer, ``save_pretrained`` export, and tiny random checkpoints for tests.

Needs ``transformers`` (the ``hf`` extra); importing this package does not import it until a
loader runs.
"""

from relax.models.hf.adapter import hf_forward_logits
from relax.models.hf.checkpoint import export_hf_checkpoint, save_hf_checkpoint
from relax.models.hf.loading import (
    HFTokenizer,
    check_checkpoint_dir,
    load_hf_model,
    load_hf_state_dict,
    load_hf_tokenizer,
)

__all__ = [
    "HFTokenizer",
    "check_checkpoint_dir",
    "export_hf_checkpoint",
    "hf_forward_logits",
    "load_hf_model",
    "load_hf_state_dict",
    "load_hf_tokenizer",
    "save_hf_checkpoint",
]
