"""The rollout engines, by ``--rollout-engine`` name.

Listed explicitly, like the training backends (``relax.backends.registry``). Each entry names an
``EngineEntry`` subclass in the engine's own package: it answers the light questions the rules and
the runtime ask (which sampling flags the engine honours, whether it generates from
``--hf-checkpoint``, whether it reports its own log-probs, its own configuration errors) without
importing the engine's heavy dependencies, and ``build(config)`` makes the engine in the rollout
worker. Nothing outside the engines' packages branches on an engine's name: ``relax.rollout.engines``
derives the rules, ``relax.rollout.factory`` builds through the entry, and the command line takes
``ENGINES``'s keys as ``--rollout-engine``'s choices. A new engine is one package and one line here.
"""

from __future__ import annotations

from relax.importing import load_attribute

# name -> "package.module:EntryClass". The order is the one the command line and messages list them in.
ENGINES = {
    "tiny": "relax.rollout.tiny.entry:TinyEntry",
    "hf": "relax.rollout.hf.entry:HFEntry",
    "vllm": "relax.rollout.vllm.entry:VLLMEntry",
}
# The engine a run without --rollout-engine gets: the built-in model's, or with --hf-checkpoint this one.
DEFAULT_ENGINE = "tiny"
DEFAULT_HF_ENGINE = "hf"


class EngineEntry:
    """What the rules and the runtime may ask of an engine before (and without) building it.

    Class attributes and class methods only, cheap to import: ``relax train`` asks them before Ray
    starts. A subclass overrides what differs from these defaults.
    """

    # how prose names the engine (e.g. "vLLM"); the registry name when empty
    title: str = ""
    # True: generates from --hf-checkpoint (refused without one); False: samples from the built-in
    # --task's model (refused with one)
    needs_hf_checkpoint: bool = True
    # the engine-specific sampling settings it implements (RunConfig fields of
    # relax.rollout.engines.SAMPLING_FLAGS); the others are refused with this engine
    sampling_fields: frozenset[str] = frozenset()
    # the engine-specific settings it reads (fields of relax.rollout.engines.OWN_FLAGS)
    own_fields: frozenset[str] = frozenset()
    # every step's samples carry the engine's own log-probs so that the trainer logs
    # rollout/logprob_abs_diff (an engine that is a separate implementation of the model)
    reports_behaviour_log_probs: bool = False
    # can run in the driver's process (--in-process)
    runs_in_process: bool = True

    @classmethod
    def config_errors(cls, config) -> list[str]:
        """The engine's own refusals of ``config`` (asked once the shared rules found nothing)."""
        return []

    @classmethod
    def weights_dtype(cls, config) -> str | None:
        """The dtype name the engine holds the policy in, which the weight route sends (None: the
        trainer's exported dtype, unchanged)."""
        return None

    @classmethod
    def build(cls, config):
        """The engine (a ``relax.rollout.base.GenerationEngine``) for ``config``, in the rollout worker."""
        raise NotImplementedError(f"{cls.__name__}.build")


def engine_names() -> tuple[str, ...]:
    return tuple(ENGINES)


def engine_entry(name: str) -> type[EngineEntry]:
    """The entry class of ``--rollout-engine name`` (light: imports no heavy dependency)."""
    try:
        spec = ENGINES[name]
    except KeyError:
        raise ValueError(
            f"--rollout-engine {name!r}: unknown engine; choose one of {', '.join(ENGINES)}"
        ) from None
    return load_attribute(spec, "--rollout-engine")
