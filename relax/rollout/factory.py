"""What the rollout worker builds from a ``RunConfig``: engine, prompt source, reward function.

The embedded default (no ``--hf-checkpoint``) uses the built-in ``--task``'s engine and prompts;
with ``--hf-checkpoint`` the transformers engine, with ``--prompt-data`` a file of prompts.
"""

from __future__ import annotations

from relax.config.run import RunConfig


def function_reward_setup(config: RunConfig):
    """-> ``(reward_fn, its keys)``: ``--custom-rm-path`` if given, else the task's (with
    ``--reward-timeout``); its keys are the ``--reward-keys`` no reward service fills."""
    from relax.rollout.reward_services import services_of
    from relax.rollout.rewards import load_reward_function, with_timeout
    from relax.rollout.tasks import get_task

    served = {s.key for s in services_of(config)}
    keys = tuple(k for k in config.algorithm.reward_keys if k not in served)
    if config.custom_rm_path:
        fn = load_reward_function(config.custom_rm_path)
    else:
        fn = get_task(config.task).reward_fn
    return with_timeout(fn, getattr(config, "reward_timeout", None)), keys  # --reward-timeout


def reward_setup(config: RunConfig):
    """-> ``(reward_fn, reward_keys)``: the reward function, or with ``--reward-model-path`` /
    ``--judge-model-path`` a ``CombinedRewards`` of the function and the services."""
    from relax.rollout.reward_services import CombinedRewards, services_of

    fn, fn_keys = function_reward_setup(config)
    keys = tuple(config.algorithm.reward_keys)
    services = services_of(config)
    return (CombinedRewards(fn, fn_keys, services, keys) if services else fn), keys


def build_engine(config: RunConfig):
    """The rollout's generation engine (it owns a copy of the policy weights): ``--rollout-engine``'s
    entry builds it (``relax.rollout.registry``). It runs on the worker's GPU when Ray gave the worker
    one (a worker without a GPU sees none and stays on the CPU); what it returns is on the CPU."""
    from relax.rollout.engines import run_engine

    return run_engine(config).build(config)


def build_prompt_source(config: RunConfig, tokenizer):
    """A resumable prompt source with ``next_batch(n)``, ``state_dict()`` and ``load_state_dict()``."""
    if config.prompt_data:
        from relax.rollout.data import prompt_iterator_from_config

        return prompt_iterator_from_config(config, tokenizer)
    from relax.rollout.tasks import get_task

    task = get_task(config.task)
    if task.prompt_source is not None:  # a task for HF models: formatted with the run's tokenizer
        return task.prompt_source(config, tokenizer)
    return task.make_prompts(config.seed)


def evaluation_source(config: RunConfig) -> str | None:
    """What the run evaluates on: ``"file"`` (``--eval-prompt-data``), ``"held-out"`` (the built-in
    task's held-out problems, scored by the task's own reward: the default of the embedded default,
    i.e. no ``--hf-checkpoint``, ``--prompt-data`` or ``--custom-rm-path``), or None (no evaluation;
    always with ``--no-eval``)."""
    if not config.evaluate:
        return None
    if config.eval_prompt_data:
        return "file"
    if config.prompt_data or config.custom_rm_path:
        return None  # prompts or a reward of the user's: only --eval-prompt-data says what to measure
    from relax.rollout.tasks import get_task

    task = get_task(config.task)
    if task.needs_hf_checkpoint:  # e.g. reasoning-gym: its held-out problems, for the user's model
        return "held-out" if task.eval_prompts is not None else None
    if config.hf_checkpoint:
        return None  # a model of the user's on the tiny model's task: nothing meaningful to measure
    return "held-out" if task.held_out is not None else None


def build_eval_prompts(config: RunConfig, tokenizer) -> list:
    """The evaluation prompts (``evaluation_source``), in a fixed order; [] without evaluation."""
    source = evaluation_source(config)
    if source == "file":
        from relax.rollout.data import eval_dataset_from_config

        return list(eval_dataset_from_config(config, tokenizer).prompts)
    if source == "held-out":
        from relax.rollout.tasks import get_task

        task = get_task(config.task)
        if task.eval_prompts is not None:
            return list(task.eval_prompts(config, tokenizer))
        return list(task.held_out())
    return []
