"""What the rollout worker builds from a ``RunConfig``: engine, prompt source, reward function.

The embedded default (no ``--hf-checkpoint``) uses the built-in ``--task``'s engine and prompts;
with ``--hf-checkpoint`` the transformers engine, with ``--prompt-data`` a file of prompts.
"""

from __future__ import annotations


def reward_setup(config):
    """-> ``(reward_fn, reward_keys)``: ``--custom-rm-path`` if given, else the task's (with ``--reward-timeout``)."""
    from relax.rollout.rewards import load_reward_function, with_timeout
    from relax.rollout.tasks import get_task

    keys = tuple(config.algorithm.reward_keys)
    if config.custom_rm_path:
        fn = load_reward_function(config.custom_rm_path)
    else:
        fn = get_task(config.task).reward_fn
    return with_timeout(fn, getattr(config, "reward_timeout", None)), keys  # --reward-timeout


def build_engine(config):
    """The rollout's generation engine (it owns a copy of the policy weights)."""
    if config.hf_checkpoint:
        from relax.rollout.hf.factory import hf_engine_from_config

        return hf_engine_from_config(config)
    from relax.rollout.tasks import get_task

    return get_task(config.task).make_engine()


def build_prompt_source(config, tokenizer):
    """A resumable prompt source with ``next_batch(n)``, ``state_dict()`` and ``load_state_dict()``."""
    if config.prompt_data:
        from relax.rollout.data import prompt_iterator_from_config

        return prompt_iterator_from_config(config, tokenizer)
    from relax.rollout.tasks import get_task

    return get_task(config.task).make_prompts(config.seed)
