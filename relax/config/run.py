"""``RunConfig``: everything ``relax train`` needs besides the algorithm hyper-parameters, as plain data
(attrs, frozen: it pickles to every Ray process; the runtime only reads it). Each field is named after
its flag (``--rollout-batch-size`` -> ``rollout_batch_size``) and declares it with its rule in
``metadata=flag(...)`` (``relax.config.fields``): the parser is generated from them, and
``relax.runtime.checks.validation`` applies the rules (and the cross-field ones) for ``relax train`` and
``run()``, reporting every problem at once.
"""

from __future__ import annotations

import attrs

from relax.config import steps
from relax.config.algorithm import AlgorithmConfig
from relax.config.fields import (
    FINITE,
    INTEGER,
    NON_NEGATIVE,
    NON_NEGATIVE_INT,
    POSITIVE,
    POSITIVE_INT,
    REWARD_KEY,
    OneOf,
    Range,
    Text,
    flag,
)
from relax.config.run_flags import LR_DECAY_STYLES, SHARDING_MODES, WEIGHT_TRANSPORTS, hook_flag


@attrs.frozen(kw_only=True)
class RunConfig:
    # -- algorithm --
    # The CLI checks the name against the registry (relax.cli.arguments); here it is any non-empty spec.
    advantage_estimator: str = attrs.field(default="grpo", metadata=flag(
        "RL method: a registered name (`relax algorithms` lists them) or a dotted path "
        "'package.module:ClassName' to your own RLAlgorithm subclass",
        group="algorithm", check=Text("an algorithm spec"), metavar="NAME|MODULE:CLASS"))
    # its fields' flags are declared on AlgorithmConfig and on the method's own Config (a subclass)
    algorithm: AlgorithmConfig = attrs.field(factory=AlgorithmConfig)
    reward_key: str | None = attrs.field(default=None, metadata=flag(
        "the component shown as the run's reward (one of --reward-keys): first in the --no-progress summary "
        "line and the end-of-run table, the only one in the progress bar (default: every component)",
        group="rewards", check=REWARD_KEY))
    # -- batch shape / schedule --
    # 450 rollouts: ~75 s wall on 2 cores; on the built-in task (GRPO) correct 0.20 -> 0.72, held-out 0.15 -> 0.90
    num_rollout: int = attrs.field(default=450, metadata=flag(
        "training steps (one rollout each)", group="batch shape", check=POSITIVE_INT))
    rollout_batch_size: int = attrs.field(default=32, metadata=flag(
        "prompts per rollout", group="batch shape", check=POSITIVE_INT))
    global_batch_size: int | None = attrs.field(default=None, metadata=flag(
        "samples per optimizer step (default: derived, see above)", group="batch shape", check=POSITIVE_INT))
    num_steps_per_rollout: int | None = attrs.field(default=None, metadata=flag(
        "optimizer steps per rollout (default: derived, see above)", group="batch shape", check=POSITIVE_INT))
    micro_batch_size: int | None = attrs.field(default=None, metadata=flag(
        "samples per forward/backward on one worker (default: the worker's whole mini-batch)",
        group="batch shape", check=POSITIVE_INT))
    max_tokens_per_micro_batch: int | None = attrs.field(default=None, metadata=flag(
        "token budget of the policy's micro-batches (torch backend): samples are grouped by real token count "
        "(prompt + response) and each group runs as one padding-free packed row; a longer sample is a "
        "micro-batch of its own. Replaces --micro-batch-size for the policy's passes (default: off)",
        group="batch shape", check=POSITIVE_INT, metavar="N"))
    # -- optimization --
    lr: float = attrs.field(default=3e-4, metadata=flag(
        "actor learning rate", group="optimization", check=POSITIVE))
    critic_lr: float = attrs.field(default=1e-3, metadata=flag(
        "critic learning rate (critic methods only)", group="optimization", check=POSITIVE))
    clip_grad: float = attrs.field(default=1.0, metadata=flag(
        "gradient-norm clip (0 disables)", group="optimization", check=NON_NEGATIVE))
    lr_warmup_steps: int = attrs.field(default=0, metadata=flag(
        "linear learning-rate warm-up over this many optimizer steps (actor and critic)", group="optimization",
        check=NON_NEGATIVE_INT))
    lr_decay_style: str = attrs.field(default="constant", metadata=flag(
        "learning-rate decay after the warm-up, down to --min-lr at the run's last optimizer step "
        "(--num-rollout x optimizer steps per rollout)", group="optimization",
        check=OneOf(LR_DECAY_STYLES)))
    min_lr: float = attrs.field(default=0.0, metadata=flag(
        "floor of the linear / cosine decay (the critic's floor is the same fraction of --critic-lr)",
        group="optimization", check=NON_NEGATIVE))
    weight_decay: float = attrs.field(default=0.0, metadata=flag(
        "decoupled (AdamW) weight decay; biases and norm scales (every 1-D parameter) are exempt",
        group="optimization", check=NON_NEGATIVE))
    adam_beta1: float = attrs.field(default=0.9, metadata=flag(
        "Adam beta1", group="optimization", check=Range(ge=0, lt=1)))
    adam_beta2: float = attrs.field(default=0.999, metadata=flag(
        "Adam beta2", group="optimization", check=Range(ge=0, lt=1)))
    adam_eps: float = attrs.field(default=1e-8, metadata=flag(
        "Adam epsilon", group="optimization", check=POSITIVE))
    value_clip: float = attrs.field(default=0.2, metadata=flag(
        "critic value clip range (critic methods only)", group="algorithm", check=NON_NEGATIVE))
    seed: int = attrs.field(default=1234, metadata=flag(
        "random seed (sampling, initialization, prompt order)", group="optimization", check=INTEGER))
    # -- sampling --
    rollout_temperature: float = attrs.field(default=1.0, metadata=flag(
        "sampling temperature", group="sampling", check=POSITIVE))
    rollout_top_p: float = attrs.field(default=1.0, metadata=flag(
        "nucleus sampling threshold", group="sampling", check=Range(gt=0, le=1)))
    rollout_max_response_len: int = attrs.field(default=8, metadata=flag(
        "maximum generated tokens per sample", group="sampling", check=POSITIVE_INT))
    overlong_filter: bool = attrs.field(default=False, metadata=flag(
        "DAPO over-long filtering: a response cut at --rollout-max-response-len (no end-of-sequence token) "
        "contributes nothing to the loss, and the loss's token and sequence counts exclude it; its reward "
        "still enters its group's statistics", group="sampling"))
    # Choices: the registered engines (added by relax.cli.arguments; relax.rollout.registry is above).
    rollout_engine: str | None = attrs.field(default=None, metadata=flag(
        "generation engine of the rollout workers: tiny (the built-in model), hf (relax's transformers loop) or "
        "vllm (vLLM inside each rollout worker; needs the vllm extra, docs/en/rollout-engines.md); default: hf "
        "with --hf-checkpoint, else tiny", group="sampling"))
    rollout_top_k: int = attrs.field(default=0, metadata=flag(
        "sample only from the K most likely tokens (vllm and tiny engines); 0 = no top-k",
        group="sampling", check=NON_NEGATIVE_INT, metavar="K"))
    rollout_min_p: float = attrs.field(default=0.0, metadata=flag(
        "drop tokens whose probability is below this fraction of the most likely token's (vllm and tiny "
        "engines); 0 = no min-p", group="sampling", check=Range(ge=0, lt=1)))
    rollout_stop: tuple[str, ...] = attrs.field(default=(), converter=tuple, metadata=flag(
        "end a completion at the first of these strings, kept in the completion (vllm engine); the stop "
        "tokens of the tokenizer always end it", group="sampling", nargs="+", metavar="TEXT"))
    # -- model and data --
    task: str = attrs.field(default="addition", metadata=flag(
        "built-in task (prompts, labels and reward function) used when no --prompt-data is given",
        group="model and data"))
    hf_checkpoint: str | None = attrs.field(default=None, metadata=flag(
        "Hugging Face model directory (default: the built-in tiny model)", group="model and data",
        metavar="PATH"))
    ref_load: str | None = attrs.field(default=None, metadata=flag(
        "reference model for KL terms (default: the initial policy)", group="model and data",
        metavar="PATH"))
    prompt_data: str | None = attrs.field(default=None, metadata=flag(
        "prompt data set (.jsonl or .parquet) instead of the built-in task", group="model and data",
        metavar="FILE.jsonl"))
    input_key: str = attrs.field(default="prompt", metadata=flag(
        "prompt field of --prompt-data records", group="model and data"))
    label_key: str = attrs.field(default="label", metadata=flag(
        "label field of --prompt-data records", group="model and data"))
    metadata_key: str | None = attrs.field(default=None, metadata=flag(
        "metadata field of --prompt-data records (passed to the reward function)", group="model and data"))
    apply_chat_template: bool = attrs.field(default=False, metadata=flag(
        "format prompts with the tokenizer's chat template", group="model and data"))
    system_prompt: str | None = attrs.field(default=None, metadata=flag(
        "system message (chat template)", group="model and data"))
    prompt_suffix: str | None = attrs.field(default=None, metadata=flag(
        "text appended to every prompt", group="model and data"))
    max_prompt_len: int | None = attrs.field(default=None, metadata=flag(
        "drop prompts longer than this many tokens", group="model and data", check=POSITIVE_INT))
    # -- hooks --
    custom_rm_path: str | None = attrs.field(default=None, metadata=hook_flag(
        "your reward function fn(prompt, completion, label, metadata) -> number or {key: number} "
        "(sync or async)"))
    reward_timeout: float | None = attrs.field(default=None, metadata=flag(
        "fail the run when one reward call takes longer than this many seconds, naming the function "
        "and the sample (default: no limit)", group="rewards", check=POSITIVE, metavar="SECONDS"))
    reward_concurrency: int = attrs.field(default=1, metadata=flag(
        "reward calls of a plain (not async) --custom-rm-path function that run at once, in threads "
        "(async functions are always gathered); results stay in sample order", group="rewards",
        check=POSITIVE_INT))
    custom_reward_post_process_path: str | None = attrs.field(default=None, metadata=hook_flag(
        "post_process(rewards, group_ids, samples) -> float32 [N]: replaces the algorithm's reward "
        "normalization in the rollout worker (rejected where the method forbids it; docs/en/hooks.md)"))
    dynamic_sampling_filter_path: str | None = attrs.field(default=None, metadata=hook_flag(
        "keep_filter(rewards, group_ids, samples, keep) -> bool [N]: which prompt groups the rollout "
        "keeps, given the algorithm's own verdict keep (whole groups; docs/en/hooks.md)"))
    # -- reward services: a reward model and a judge on Ray Serve (relax.runtime.cluster.reward_services) --
    reward_model_path: str | None = attrs.field(default=None, metadata=flag(
        "a Hugging Face sequence-classification model (one logit) that scores prompt + completion, served "
        "on Ray Serve with dynamic batching and shared by every rollout worker; its score is the reward "
        "component --reward-model-key (docs/en/rewards.md#reward-services)", group="reward services",
        metavar="DIR"))
    reward_model_key: str = attrs.field(default="rm", metadata=flag(
        "the reward component the reward model's score fills (one of --reward-keys)", group="reward services",
        check=REWARD_KEY))
    reward_model_replicas: int = attrs.field(default=1, metadata=flag(
        "Serve replicas of the reward model (each loads the model)", group="reward services",
        check=POSITIVE_INT, metavar="N"))
    reward_model_batch_size: int = attrs.field(default=32, metadata=flag(
        "most samples one batched reward-model forward pass scores", group="reward services",
        check=POSITIVE_INT, metavar="N"))
    reward_model_batch_wait_s: float = attrs.field(default=0.01, metadata=flag(
        "how long a replica waits for more samples before it scores a batch smaller than "
        "--reward-model-batch-size", group="reward services", check=NON_NEGATIVE, metavar="SECONDS"))
    reward_model_cpus: float = attrs.field(default=1.0, metadata=flag(
        "CPUs each reward-model replica requests from Ray", group="reward services", check=POSITIVE))
    reward_model_gpus: float | None = attrs.field(default=None, metadata=flag(
        "GPUs each reward-model replica requests (default: an equal share, at most 1, of the GPUs the "
        "workers leave free; 0 on a cluster without GPUs)", group="reward services", check=NON_NEGATIVE))
    judge_model_path: str | None = attrs.field(default=None, metadata=flag(
        "a Hugging Face causal LM that judges each sample from --judge-template; its score is the "
        "probability of ' yes' against ' no' as the next token, served like --reward-model-path, as the "
        "reward component --judge-key", group="reward services", metavar="DIR"))
    judge_template: str | None = attrs.field(default=None, metadata=flag(
        "the judge's prompt: a text file with {prompt} and {response} (and optionally {label}) "
        "placeholders, ending where the judge's answer ' yes' or ' no' begins", group="reward services",
        metavar="FILE"))
    judge_key: str = attrs.field(default="judge", metadata=flag(
        "the reward component the judge's score fills (one of --reward-keys)", group="reward services",
        check=REWARD_KEY))
    judge_replicas: int = attrs.field(default=1, metadata=flag(
        "Serve replicas of the judge", group="reward services", check=POSITIVE_INT, metavar="N"))
    judge_batch_size: int = attrs.field(default=32, metadata=flag(
        "most samples one batched judge forward pass scores", group="reward services", check=POSITIVE_INT,
        metavar="N"))
    judge_batch_wait_s: float = attrs.field(default=0.01, metadata=flag(
        "how long a judge replica waits for more samples before it scores a smaller batch",
        group="reward services", check=NON_NEGATIVE, metavar="SECONDS"))
    judge_cpus: float = attrs.field(default=1.0, metadata=flag(
        "CPUs each judge replica requests from Ray", group="reward services", check=POSITIVE))
    judge_gpus: float | None = attrs.field(default=None, metadata=flag(
        "GPUs each judge replica requests (default: as --reward-model-gpus)", group="reward services",
        check=NON_NEGATIVE))
    # -- multi-turn episodes (relax.rollout.environments) --
    env_path: str | None = attrs.field(default=None, metadata=flag(
        "your environment class (relax.rollout.Environment: reset(sample), step(completion) -> EnvStep): "
        "every sample becomes a multi-turn episode scored by the environment's reward components "
        "(docs/en/multi-turn.md)", group="multi-turn", metavar="MODULE:CLASS"))
    max_turns: int = attrs.field(default=4, metadata=flag(
        "most model turns per episode (with --env-path or a task that has an environment)",
        group="multi-turn", check=POSITIVE_INT, metavar="N"))
    env_timeout: float | None = attrs.field(default=None, metadata=flag(
        "fail the run when one environment reset or step takes longer than this many seconds, naming the "
        "environment, episode and turn (default: no limit)", group="multi-turn", check=POSITIVE,
        metavar="SECONDS"))
    # -- dynamic sampling (relax.runtime.step.rollout_worker) --
    over_sampling_batch_size: int | None = attrs.field(default=None, metadata=flag(
        "prompts drawn per sampling round (default: --rollout-batch-size); with --max-sampling-rounds > 1 "
        "the rollout draws rounds until it has --rollout-batch-size prompt groups with signal",
        group="sampling", check=POSITIVE_INT, metavar="N"))
    max_sampling_rounds: int = attrs.field(default=1, metadata=flag(
        "most sampling rounds per step; 1 = no refill (groups without signal are only dropped); after the "
        "last round the step trains on the groups it has", group="sampling", check=POSITIVE_INT,
        metavar="R"))
    # -- placement / backends --
    ray_address: str | None = attrs.field(default=None, metadata=flag(
        "Ray cluster to join (default: start a local one)", group="placement and backends"))
    in_process: bool = attrs.field(default=False, metadata=flag(
        "run the one rollout worker and the one actor rank in this process, without Ray, TransferQueue or "
        "Serve (CPU, the synchronous schedule; starts in a few seconds and gives the numbers of the Ray "
        "runtime); refuses what needs Ray: more workers, --ray-address, GPUs, megatron, --fully-async, a "
        "critic, reward services", group="placement and backends"))
    ray_working_dir: str | None = attrs.field(default=None, metadata=flag(
        "ship this directory to every Ray worker as its working directory (at most 100 MiB without .git, "
        "__pycache__, the output directory and Ray's temp dir); by default a run that joins a cluster ships only "
        "your own modules named by --advantage-estimator, --custom-rm-path, the hooks and --env-path",
        group="placement and backends", metavar="DIR"))
    worker_timeout: float = attrs.field(default=60.0, metadata=flag(
        "end the run when a worker's heartbeat stops for this many seconds (stopped, swapped out, stuck in a "
        "kernel call), naming the worker, after \"still waiting\" lines; a step without progress for 10x this "
        "(or 20x the slowest step so far) ends it too; at least 5 (workers beat every second)",
        group="placement and backends", check=Range(ge=5), metavar="SECONDS"))
    actor_num_workers: int = attrs.field(default=1, metadata=flag(
        "training worker processes (torch: data-parallel ranks; megatron: TP x PP x DP)",
        group="placement and backends", check=POSITIVE_INT))
    # The registered backends are the flag's choices (added by relax.cli.arguments: the registry is above).
    backend: str = attrs.field(default="torch", metadata=flag(
        "training backend; megatron needs the extra: pip install 'relax-rl[megatron]'",
        group="placement and backends"))
    tensor_model_parallel_size: int = attrs.field(default=1, metadata=flag(
        "Megatron tensor parallelism", group="placement and backends", check=POSITIVE_INT))
    pipeline_model_parallel_size: int = attrs.field(default=1, metadata=flag(
        "Megatron pipeline parallelism", group="placement and backends", check=POSITIVE_INT))
    lora_rank: int = attrs.field(default=0, metadata=flag(
        "train LoRA adapters of this rank instead of the whole model (torch backend, --hf-checkpoint; "
        "needs peft: pip install 'relax-rl[lora]'); 0 trains every weight", group="placement and backends",
        check=NON_NEGATIVE_INT))
    lora_alpha: float = attrs.field(default=16.0, metadata=flag(
        "LoRA scale numerator: the adapter's update is (B @ A) x lora-alpha / lora-rank",
        group="placement and backends", check=POSITIVE))
    lora_dropout: float = attrs.field(default=0.0, metadata=flag(
        "dropout on the LoRA branch's input while training", group="placement and backends",
        check=Range(ge=0, lt=1)))
    lora_target_modules: tuple[str, ...] = attrs.field(default=("all-linear",), converter=tuple, metadata=flag(
        "layers that get adapters: module-name suffixes (e.g. q_proj v_proj), or all-linear (every linear "
        "layer but the output head)", group="placement and backends", nargs="+", metavar="NAME"))
    bf16: bool = attrs.field(default=False, metadata=flag(
        "train in bfloat16 mixed precision with float32 master weights and Adam state (torch backend: "
        "autocast over float32 weights; Megatron: bfloat16 parameters, megatron-core's mixed-precision optimizer)",
        group="placement and backends"))
    recompute_activations: bool = attrs.field(default=False, metadata=flag(
        "recompute each transformer block's activations in the backward pass (less memory, more compute)",
        group="placement and backends"))
    advantages_on_actor: bool = attrs.field(default=False, metadata=flag(
        "compute advantages on the training ranks instead of the advantages service",
        group="placement and backends"))
    rollout_num_workers: int = attrs.field(default=1, metadata=flag(
        "rollout workers (generation engines); each samples its slice of every step's prompts",
        group="placement and backends", check=POSITIVE_INT))
    # -- asynchronous training --
    fully_async: bool = attrs.field(default=False, metadata=flag(
        "overlap generation with training: rollouts run up to --max-staleness policy versions ahead",
        group="asynchronous training"))
    max_staleness: int | None = attrs.field(default=None, metadata=flag(
        "the most policy versions a trained sample may lag behind (default 1 with --fully-async; "
        "0 reproduces the synchronous run)", group="asynchronous training", check=NON_NEGATIVE_INT,
        metavar="K"))
    # -- outputs --
    output_dir: str | None = attrs.field(default=None, metadata=flag(
        "where checkpoints, metrics and config.yaml go (default: outputs/<run-name>)", group="outputs",
        metavar="DIR"))
    overwrite_output_dir: bool = attrs.field(default=False, metadata=flag(
        "let a new run replace the run already in --output-dir (its metrics.jsonl and checkpoints/ are "
        "deleted); without it such a directory is refused unless --load resumes it", group="outputs"))
    run_name: str | None = attrs.field(default=None, metadata=flag(
        "run name (default: <advantage-estimator>-<date>-<time>)", group="outputs"))
    save_interval: int | None = attrs.field(default=None, metadata=flag(
        "also save a checkpoint every this many rollouts (default: none in between); the final step is "
        "always saved, and on Ctrl-C / SIGTERM the last trained step", group="outputs",
        check=POSITIVE_INT))
    keep_checkpoints: int | None = attrs.field(default=None, metadata=flag(
        "keep only the newest N checkpoints of this run: after each successful save the oldest "
        "checkpoints/step_* directories beyond N are deleted (default: keep all)", group="outputs",
        check=POSITIVE_INT, metavar="N"))
    load: str | None = attrs.field(default=None, metadata=flag(
        "resume from this checkpoint directory; a `relax sft` checkpoint of the built-in model starts a new "
        "run from its weights instead", group="outputs", metavar="DIR"))
    progress: bool = attrs.field(default=True, metadata=flag(
        "no progress bar (prints a summary line every --log-interval steps instead)", group="outputs",
        names=("--no-progress",)))
    # -- logging (relax.runtime.files.trackers; docs/en/tracking.md) --
    log_interval: int = attrs.field(default=10, metadata=flag(
        "with --no-progress: print one summary line every this many steps", group="logging",
        check=POSITIVE_INT, metavar="N"))
    use_tensorboard: bool = attrs.field(default=False, metadata=flag(
        "write every metric to TensorBoard event files in the run directory (needs the 'tracking' "
        "extra: pip install -e '.[tracking]')", group="logging"))
    use_wandb: bool = attrs.field(default=False, metadata=flag(
        "log every metric to Weights & Biases; offline (a run directory under <output-dir>/wandb) "
        "unless WANDB_MODE says otherwise or an API key is set and the server is reachable",
        group="logging"))
    wandb_project: str = attrs.field(default="relax", metadata=flag(
        "W&B project (with --use-wandb)", group="logging", metavar="NAME"))
    wandb_group: str | None = attrs.field(default=None, metadata=flag(
        "W&B run group, e.g. to compare methods (with --use-wandb)", group="logging", metavar="NAME"))
    wandb_run_name: str | None = attrs.field(default=None, metadata=flag(
        "W&B run name (with --use-wandb; default: the run name)", group="logging", metavar="NAME"))
    log_completions: int = attrs.field(default=0, metadata=flag(
        "every step, append this many samples (prompt, completion, label, reward components, "
        "normalized reward, policy version) to completions.jsonl and to the trackers as a table",
        group="logging", check=NON_NEGATIVE_INT, metavar="N"))
    # -- evaluation (relax.runtime.driver.evaluation; docs/en/evaluation.md) --
    evaluate: bool = attrs.field(default=True, metadata=flag(
        "no evaluation at all (not even the built-in task's held-out problems before and after training)",
        group="evaluation", names=("--no-eval",)))
    eval_prompt_data: str | None = attrs.field(default=None, metadata=flag(
        "evaluation prompts (.jsonl or .parquet, the format of --prompt-data); default: the built-in task's "
        "held-out problems when the run is the embedded default (no --hf-checkpoint, --prompt-data or "
        "--custom-rm-path), else no evaluation", group="evaluation", metavar="FILE.jsonl"))
    eval_input_key: str | None = attrs.field(default=None, metadata=flag(
        "prompt field of --eval-prompt-data records (default: --input-key)", group="evaluation"))
    eval_label_key: str | None = attrs.field(default=None, metadata=flag(
        "label field of --eval-prompt-data records (default: --label-key)", group="evaluation"))
    eval_metadata_key: str | None = attrs.field(default=None, metadata=flag(
        "metadata field of --eval-prompt-data records (default: --metadata-key)", group="evaluation"))
    eval_interval: int | None = attrs.field(default=None, metadata=flag(
        "also evaluate after every this many training steps (default: only before training and after "
        "the last step)", group="evaluation", check=POSITIVE_INT, metavar="N"))
    eval_before_train: bool = attrs.field(default=True, metadata=flag(
        "skip the evaluation of the initial policy (step 0)", group="evaluation",
        names=("--no-eval-before-train",)))
    eval_n_samples_per_prompt: int = attrs.field(default=1, metadata=flag(
        "completions per evaluation prompt (k of eval/pass@k; sample with --eval-temperature > 0)",
        group="evaluation", check=POSITIVE_INT, metavar="K"))
    eval_temperature: float = attrs.field(default=0.0, metadata=flag(
        "evaluation sampling temperature; 0 = greedy decoding", group="evaluation", check=NON_NEGATIVE))
    eval_top_p: float = attrs.field(default=1.0, metadata=flag(
        "evaluation nucleus sampling threshold", group="evaluation", check=Range(gt=0, le=1)))
    eval_max_response_len: int | None = attrs.field(default=None, metadata=flag(
        "maximum generated tokens per evaluation sample (default: --rollout-max-response-len)",
        group="evaluation", check=POSITIVE_INT))
    eval_pass_threshold: float = attrs.field(default=1.0, metadata=flag(
        "a sample passes (eval/pass@k) when its pass component is >= this; the pass component is "
        "--reward-key if given, else 'correct' if it is a reward key, else the first --reward-keys entry",
        group="evaluation", check=FINITE))
    # -- the vLLM engine on a GPU (relax.rollout.vllm.factory) --
    rollout_gpu_memory_utilization: float | None = attrs.field(default=None, metadata=flag(
        "share of its GPU's memory the vllm engine may take (weights, activations, KV cache); default 0.5 "
        "when the rollout worker shares its GPU with an actor rank, 0.9 with a GPU of its own",
        group="placement and backends", check=Range(gt=0, le=1), metavar="FRACTION"))
    # -- sharding (relax.backends.sharding; docs/en/sharding.md) --
    sharding: str = attrs.field(default="none", metadata=flag(
        "fsdp: the torch backend shards parameters, gradients and Adam state (and the reference model) over "
        "the --actor-num-workers data-parallel ranks (FSDP2), so each rank holds 1/N of them; none: every "
        "rank holds the whole model", group="placement and backends", check=OneOf(SHARDING_MODES)))
    # -- user code under a deadline (relax.rollout.hooks) --
    hook_timeout: float = attrs.field(default=120.0, metadata=flag(
        "fail the run when one call of --dynamic-sampling-filter-path or --custom-reward-post-process-path "
        "takes longer than this many seconds, naming the hook and the step (0: no limit)", group="rewards",
        check=Range(ge=0), metavar="SECONDS"))
    # -- distillation: the teacher role (relax.models.teacher; docs/en/distillation.md) --
    teacher_checkpoint: str | None = attrs.field(default=None, metadata=flag(
        "the frozen teacher of a method that needs one (e.g. on-policy-distill): a Hugging Face model "
        "directory, a relax run checkpoint (state.pt, a checkpoints/step_* or run directory), or with the "
        "built-in tiny model a tiny checkpoint file; its tokenizer must be the student's", group="teacher",
        metavar="DIR"))
    weight_transport: str = attrs.field(default="object-store", metadata=flag(  # docs/en/weight-transport.md
        "how actor rank 0 sends each policy version to the rollout workers: object-store (a buffer in Ray's "
        "object store) or collective (a torch.distributed broadcast: gloo, or NCCL when every end has a GPU)",
        group="placement and backends", check=OneOf(WEIGHT_TRANSPORTS)))

    total_optimizer_steps = steps.total_optimizer_steps  # derived from the fields: relax.config.steps
    staleness_bound = property(steps.staleness_bound)
