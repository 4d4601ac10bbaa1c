"""The checkpoints ``relax sft`` writes: ``<output_dir>/checkpoints/step_<k>/``.

Each holds ``state.pt``, a relax checkpoint (the backend's state under ``actor``/``backend``, as
``relax train`` stores it, so the backend's ``weights_in_state`` finds the weights), the trained model
in the form the next command loads — ``model.pt`` for the built-in model (``load_warmup_model``),
``hf/`` for a Hugging Face model (``--hf-checkpoint``; LoRA adapters merged, the adapter alone in
``hf/adapter``) — and the marker ``sft.json`` (``relax.models.initial_weights``).

The files are written into a hidden ``.step_<k>.partial`` directory that is renamed to ``step_<k>``
once all are there: a save cut short (a second Ctrl-C, a full disk) leaves no ``step_<k>`` for
``--load DIR`` to pick as the newest, and its partial directory is removed.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from relax.models.checkpoint_paths import STATE_FILE
from relax.models.initial_weights import HF_MODEL_DIR, TINY_MODEL_FILE, write_marker
from relax.runtime.files.checkpoint_files import checkpoint_path, prune_checkpoints, write_state

SFT_ESTIMATOR = "sft"  # the checkpoint's advantage_estimator: no RL method wrote it


def saves_at(config, step: int) -> bool:
    """After the last step always (the run's product), and every ``--save-interval`` steps."""
    return step == config.num_rollout or (bool(config.save_interval) and step % config.save_interval == 0)


def save_sft_checkpoint(backend, config, out: Path, step: int, *, tiny_config=None, order: dict | None = None,
                        rng: dict | None = None) -> Path:
    """Write step ``step``'s checkpoint and return its directory. ``tiny_config``: the built-in model's
    ``TinyLMConfig`` (None for a Hugging Face model); ``order``: the data order ``relax sft --load``
    checks (``relax.recipes.sft_resume.order_settings``); ``rng``: torch's random state after the step."""
    final = checkpoint_path(out, step).parent
    directory = final.with_name(f".{final.name}.partial")
    shutil.rmtree(directory, ignore_errors=True)  # a partial save of an earlier, interrupted run
    directory.mkdir(parents=True)
    try:
        _write_files(backend, config, directory, step, tiny_config, order, rng)
        if final.exists():  # the same step saved again (a resumed run that redid it)
            shutil.rmtree(final)
        os.replace(directory, final)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    if config.keep_checkpoints:
        prune_checkpoints(out, config.keep_checkpoints)
    return final


def _write_files(backend, config, directory: Path, step: int, tiny_config, order, rng) -> None:
    backend_state = backend.state_dict()
    write_state({"step": step, "actor": {"backend": backend_state}, "rollout": [], "critic": None,
                 "advantage_estimator": SFT_ESTIMATOR, "backend": config.backend, "sft": {"rng": rng}},
                directory / STATE_FILE)
    weights = {k: v.detach().cpu() for k, v in type(backend).weights_in_state(backend_state).items()}
    if config.hf_checkpoint:
        from relax.models.hf.checkpoint import export_hf_checkpoint

        export_hf_checkpoint(weights, config.hf_checkpoint, directory / HF_MODEL_DIR)
    else:
        from relax.models.tiny.model import TinyCausalLM
        from relax.models.tiny.weights import save_tiny_checkpoint

        model = TinyCausalLM(tiny_config)
        model.load_state_dict(weights)
        save_tiny_checkpoint(model, directory / TINY_MODEL_FILE, {"command": "relax sft", "step": step}, {})
    write_marker(directory, model="hf" if config.hf_checkpoint else "tiny", step=step,
                 hf_checkpoint=config.hf_checkpoint, task=config.task, extra=order)
