"""What ``--backend megatron`` refuses, known before megatron-core is imported: ``MegatronRules``,
the base of both the registry's light entry (``MegatronEntry``, in the package) and ``MegatronBackend``,
so that neither imports the other's module."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from relax.backends.base import TrainingBackend


def megatron_installed() -> bool:
    """Is megatron-core importable? Looks at the files only: importing it is slow and heavy."""
    spec = importlib.util.find_spec("megatron")
    if spec is None or not spec.submodule_search_locations:
        return False
    return any((Path(p) / "core" / "__init__.py").is_file() for p in spec.submodule_search_locations)


class MegatronRules(TrainingBackend):
    """``--backend megatron``'s name and configuration check (without megatron-core)."""

    name = "megatron"

    @classmethod
    def config_errors(cls, config) -> list[str]:
        """What a ``RunConfig`` asks of ``--backend megatron`` that it cannot do (without importing it)."""
        from relax.backends import optim

        errors = optim.config_errors(config)
        if config.lora_rank:
            errors.append("--lora-rank is implemented for --backend torch only; drop it or use --backend torch")
        if not megatron_installed():
            errors.append(
                "--backend megatron needs megatron-core, which is not installed: pip install 'relax-rl[megatron]' "
                "(or use --backend torch)"
            )
        tp, pp = config.tensor_model_parallel_size, config.pipeline_model_parallel_size
        if config.hf_checkpoint:  # architecture and tp/pp layout, from config.json (no megatron import)
            from relax.backends.megatron.hf_model import checkpoint_errors

            errors.extend(checkpoint_errors(config.hf_checkpoint, tp_size=tp, pp_size=pp))
        if config.actor_num_workers % (tp * pp):
            errors.append(
                f"--actor-num-workers {config.actor_num_workers} must be a multiple of "
                f"--tensor-model-parallel-size {tp} x --pipeline-model-parallel-size {pp} = {tp * pp}"
            )
        return errors
