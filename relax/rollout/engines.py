"""Which generation engine a run's rollout workers use (``--rollout-engine``), and its rules.

- ``tiny``: the built-in task's model (the default without ``--hf-checkpoint``);
- ``hf``: relax's KV-cached transformers loop (the default with ``--hf-checkpoint``);
- ``vllm``: vLLM in the rollout worker's process (the ``vllm`` extra; ``relax.rollout.vllm``).

The rules run before Ray starts (``relax.runtime.validation``), so a wrong choice fails at once.
"""

from __future__ import annotations

# Sampling settings only some engines implement: RunConfig field -> (flag, engines that honour it).
ENGINE_SAMPLING_FLAGS = {
    "rollout_top_k": ("--rollout-top-k", ("vllm", "tiny")),
    "rollout_min_p": ("--rollout-min-p", ("vllm", "tiny")),
    "rollout_stop": ("--rollout-stop", ("vllm",)),
}
# Other settings only some engines have: RunConfig field -> (flag, engines that read it).
ENGINE_ONLY_FLAGS = {
    "rollout_gpu_memory_utilization": ("--rollout-gpu-memory-utilization", ("vllm",)),
}


def engine_name(config) -> str:
    """``--rollout-engine``, else the model's own engine: hf for ``--hf-checkpoint``, tiny otherwise."""
    if config.rollout_engine:
        return config.rollout_engine
    return "hf" if config.hf_checkpoint else "tiny"


def reports_behaviour_log_probs(config) -> bool:
    """Whether every step's samples carry the engine's own log-probs, so that the trainer logs
    ``rollout/logprob_abs_diff`` (the vLLM engine is a separate implementation of the model: the
    distance is what proves it holds the trainer's weights)."""
    return engine_name(config) == "vllm"


def carries_behaviour_log_probs(config) -> bool:
    """Whether the samples carry the engine's log-probs to the trainer: for the loss with
    ``--off-policy-correction``, and for ``rollout/logprob_abs_diff`` (``reports_behaviour_log_probs``)."""
    return config.algorithm.off_policy_correction != "none" or reports_behaviour_log_probs(config)


def config_errors(config) -> list[str]:
    name = engine_name(config)
    errors = []
    if name == "tiny" and config.hf_checkpoint:
        errors.append(
            f"--rollout-engine tiny samples from the built-in model, not --hf-checkpoint {config.hf_checkpoint}: "
            "use --rollout-engine hf or vllm (or drop --hf-checkpoint)"
        )
    if name != "tiny" and not config.hf_checkpoint:
        errors.append(
            f"--rollout-engine {name} generates from a Hugging Face model: give --hf-checkpoint DIR, or drop "
            "--rollout-engine to sample from the built-in model"
        )
    for field, (flag, engines) in ENGINE_SAMPLING_FLAGS.items():
        value = getattr(config, field)
        if value and name not in engines:
            errors.append(
                f"{flag} {_shown(value)} is a sampling setting of the {' / '.join(engines)} engine only; the "
                f"{name} engine would ignore it: add --rollout-engine {engines[0]} (with --hf-checkpoint) or "
                f"drop {flag}"
            )
    for field, (flag, engines) in ENGINE_ONLY_FLAGS.items():
        value = getattr(config, field)
        if value is not None and name not in engines:
            errors.append(
                f"{flag} {_shown(value)} is a setting of the {' / '.join(engines)} engine only; the {name} "
                f"engine has no use for it: add --rollout-engine {engines[0]} (with --hf-checkpoint) or drop {flag}"
            )
    if any(not text for text in config.rollout_stop):
        errors.append("--rollout-stop: a stop string must not be empty")
    if name == "vllm" and config.hf_checkpoint and not errors:
        from relax.rollout.vllm.factory import config_errors as vllm_errors

        errors.extend(vllm_errors(config))
    return errors


def _shown(value) -> str:
    return " ".join(map(str, value)) if isinstance(value, (tuple, list)) else str(value)
