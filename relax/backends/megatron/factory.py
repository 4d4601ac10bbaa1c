"""``make_megatron_backend``: what the actor worker calls for ``--backend megatron``."""

from __future__ import annotations

from relax.backends.megatron import require_megatron


def make_megatron_backend(config, model):
    """A ``MegatronBackend`` for one actor rank, initialized from ``model`` (the built-in
    ``TinyCausalLM`` the torch backend would train) with the run's optimizer settings.

    ``config`` is the ``RunConfig``. Call it *after* ``torch.distributed`` is initialized over all
    ``actor_num_workers`` ranks (= data x tensor x pipeline parallel sizes); with a single worker and
    no process group it starts a one-process group itself. Every rank must then call the backend's
    methods together (``export_weights`` and ``state_dict`` are collectives too); a rank's data shard
    is chosen by ``backend.dp_rank`` / ``backend.dp_size``, and tensor/pipeline peers pass the same one.
    """
    require_megatron()
    from relax.backends.megatron.backend import MegatronBackend
    from relax.rollout.tiny.model import TinyCausalLM

    if config.hf_checkpoint or not isinstance(model, TinyCausalLM):
        raise ValueError(
            "--backend megatron trains the built-in TinyCausalLM only; drop --hf-checkpoint or use --backend torch"
        )
    tp, pp = config.tensor_model_parallel_size, config.pipeline_model_parallel_size
    if config.actor_num_workers % (tp * pp):
        raise ValueError(
            f"--actor-num-workers {config.actor_num_workers} must be a multiple of --tensor-model-parallel-size "
            f"{tp} x --pipeline-model-parallel-size {pp} (the data-parallel size is their quotient)"
        )
    return MegatronBackend(
        model.config,
        initial_weights=model.state_dict(),
        lr=config.lr,
        clip_grad=config.clip_grad,
        seed=config.seed,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        micro_batch_size=config.micro_batch_size,
        temperature=config.rollout_temperature,
    )
