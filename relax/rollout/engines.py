"""Which generation engine a run's rollout workers use (``--rollout-engine``), and its rules.

The engines are registered in ``relax.rollout.registry`` (built in: ``tiny``, the built-in task's
model; ``hf``, relax's KV-cached transformers loop; ``vllm``, vLLM in the rollout worker's process).
The rules here are the same for every engine and read what its entry declares, so a new engine gets
them by declaring, not by an edit here.

The rules run before Ray starts (``relax.runtime.checks.validation``), so a wrong choice fails at once.
"""

from __future__ import annotations

from relax.rollout.registry import DEFAULT_ENGINE, DEFAULT_HF_ENGINE, ENGINES, engine_entry

# Sampling settings only some engines implement (an entry's ``sampling_fields``): RunConfig field -> flag.
SAMPLING_FLAGS = {
    "rollout_top_k": "--rollout-top-k",
    "rollout_min_p": "--rollout-min-p",
    "rollout_stop": "--rollout-stop",
}
# Other settings only some engines have (an entry's ``own_fields``): RunConfig field -> flag.
OWN_FLAGS = {
    "rollout_gpu_memory_utilization": "--rollout-gpu-memory-utilization",
}


def engine_name(config) -> str:
    """``--rollout-engine``, else the model's own engine: hf for ``--hf-checkpoint``, tiny otherwise."""
    if config.rollout_engine is not None:
        return config.rollout_engine
    return DEFAULT_HF_ENGINE if config.hf_checkpoint else DEFAULT_ENGINE


def run_engine(config):
    """The entry class of the run's engine (``relax.rollout.registry.EngineEntry``)."""
    return engine_entry(engine_name(config))


def reports_behaviour_log_probs(config) -> bool:
    """Whether every step's samples carry the engine's own log-probs, so that the trainer logs
    ``rollout/logprob_abs_diff`` (the vLLM engine is a separate implementation of the model: the
    distance is what proves it holds the trainer's weights)."""
    return run_engine(config).reports_behaviour_log_probs


def carries_behaviour_log_probs(config) -> bool:
    """Whether the samples carry the engine's log-probs to the trainer: for the loss with
    ``--off-policy-correction``, and for ``rollout/logprob_abs_diff`` (``reports_behaviour_log_probs``)."""
    return config.algorithm.off_policy_correction != "none" or reports_behaviour_log_probs(config)


def in_process_refusal(config) -> str | None:
    """Why ``--in-process`` cannot run the run's engine (None: it can, or the name is unknown, which
    ``config_errors`` reports)."""
    name = engine_name(config)
    if name not in ENGINES or engine_entry(name).runs_in_process:
        return None
    local = [n for n in ENGINES if engine_entry(n).runs_in_process]
    return (f"--rollout-engine {name} (in-process runs the {' and '.join(local)} engines only; "
            f"{engine_entry(name).title or name} is not tried there)")


def config_errors(config) -> list[str]:
    name = engine_name(config)
    if name not in ENGINES:  # a RunConfig built in Python; the command line offers the registered names
        choices = ", ".join(ENGINES)
        return [f"argument --rollout-engine: {name!r} is out of range; it must be one of {choices}"]
    entry = engine_entry(name)
    errors = []
    if not entry.needs_hf_checkpoint and config.hf_checkpoint:
        takers = [n for n in ENGINES if engine_entry(n).needs_hf_checkpoint]
        errors.append(
            f"--rollout-engine {name} samples from the built-in model, not --hf-checkpoint "
            f"{config.hf_checkpoint}: use --rollout-engine {' or '.join(takers)} (or drop --hf-checkpoint)"
        )
    if entry.needs_hf_checkpoint and not config.hf_checkpoint:
        errors.append(
            f"--rollout-engine {name} generates from a Hugging Face model: give --hf-checkpoint DIR, or drop "
            "--rollout-engine to sample from the built-in model"
        )
    for field, flag in SAMPLING_FLAGS.items():
        value = getattr(config, field)
        if value and field not in entry.sampling_fields:
            engines = _engines_with(field, "sampling_fields")
            errors.append(
                f"{flag} {_shown(value)} is a sampling setting of the {' / '.join(engines)} engine only; the "
                f"{name} engine would ignore it: add --rollout-engine {_suggestion(engines)} or drop {flag}"
            )
    for field, flag in OWN_FLAGS.items():
        value = getattr(config, field)
        if value is not None and field not in entry.own_fields:
            engines = _engines_with(field, "own_fields")
            errors.append(
                f"{flag} {_shown(value)} is a setting of the {' / '.join(engines)} engine only; the {name} "
                f"engine has no use for it: add --rollout-engine {_suggestion(engines)} or drop {flag}"
            )
    if any(not text for text in config.rollout_stop):
        errors.append("--rollout-stop: a stop string must not be empty")
    if not errors:
        errors.extend(entry.config_errors(config))
    return errors


def _engines_with(field: str, declared: str) -> list[str]:
    """The engines whose entry lists ``field`` in ``declared``; those that take --hf-checkpoint first
    (the one a message suggests: a run with a model of its own keeps it)."""
    engines = [n for n in ENGINES if field in getattr(engine_entry(n), declared)]
    return sorted(engines, key=lambda n: not engine_entry(n).needs_hf_checkpoint)


def _suggestion(engines: list[str]) -> str:
    first = engines[0]
    return f"{first} (with --hf-checkpoint)" if engine_entry(first).needs_hf_checkpoint else first


def _shown(value) -> str:
    return " ".join(map(str, value)) if isinstance(value, (tuple, list)) else str(value)
