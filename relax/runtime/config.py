"""``RunConfig``: everything ``relax train`` needs besides the algorithm hyper-parameters.

Field names equal the command-line flags (``--rollout-batch-size`` -> ``rollout_batch_size``). The
CLI builds and validates a ``RunConfig``; the runtime only reads it. It is plain data (attrs, frozen)
so it pickles to every Ray process.
"""

from __future__ import annotations

import attrs

from relax.algorithms.config import AlgorithmConfig


@attrs.frozen(kw_only=True)
class RunConfig:
    # -- algorithm --
    advantage_estimator: str = "grpo"  # registered name or 'package.module:ClassName'
    algorithm: AlgorithmConfig = attrs.field(factory=AlgorithmConfig)
    reward_key: str | None = None  # scalar logged as "the" reward when there are several components
    # -- batch shape / schedule --
    num_rollout: int = 450  # training steps (one rollout each); ~75 s wall on 2 cores, correct 0.19 -> 0.66
    rollout_batch_size: int = 32  # prompts per rollout
    global_batch_size: int | None = None  # samples per optimizer step (None: derived)
    num_steps_per_rollout: int | None = None  # optimizer steps per rollout (None: derived)
    micro_batch_size: int | None = None  # samples per forward/backward (None: whole mini-batch)
    # -- optimization --
    lr: float = 3e-4
    critic_lr: float = 1e-3
    clip_grad: float = 1.0
    value_clip: float = 0.2
    seed: int = 1234
    # -- sampling --
    rollout_temperature: float = 1.0
    rollout_top_p: float = 1.0
    rollout_max_response_len: int = 8
    # -- model and data --
    task: str = "addition"  # built-in task used when no --prompt-data is given
    hf_checkpoint: str | None = None
    ref_load: str | None = None
    prompt_data: str | None = None
    input_key: str = "prompt"
    label_key: str = "label"
    metadata_key: str | None = None
    apply_chat_template: bool = False
    system_prompt: str | None = None
    prompt_suffix: str | None = None
    max_prompt_len: int | None = None
    # -- hooks --
    custom_rm_path: str | None = None
    custom_reward_post_process_path: str | None = None
    dynamic_sampling_filter_path: str | None = None
    # -- placement / backends --
    ray_address: str | None = None
    actor_num_workers: int = 1
    backend: str = "torch"
    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    advantages_on_actor: bool = False
    # -- outputs --
    output_dir: str | None = None  # default outputs/<run_name>
    run_name: str | None = None
    save_interval: int | None = None
    load: str | None = None
    progress: bool = True
