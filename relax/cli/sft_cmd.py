"""``relax sft``: supervised fine-tuning on demonstrations (``relax.recipes.sft`` runs it).

The flags are ``SftConfig``'s (the demonstrations) and the ``relax train`` flags listed in
``SFT_RUN_FIELDS``, generated from the same field declarations, so each means what it means in
``relax train``. Everything is checked before a model is built: the flags' rules and ``relax train``'s
validation, pre-flight (model directory, tokenizer, evaluation data and reward, output directory),
then every row of ``--data`` (a bad row names the file, the row and the key). A rejected
configuration exits with status 2 and the message on stderr. Ctrl-C (SIGINT) and SIGTERM stop the
run after its step in progress, saved (exit status 128 + the signal's number); ``--load`` continues
it (``relax.recipes.sft_resume``).
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

import attrs
import yaml

from relax.cli.arguments import GROUPS, HelpFormatter, _add_flag, build_train_parser
from relax.cli.build import build_run_config
from relax.config.fields import field_problems, flag_name, flag_of
from relax.config.output_dir import default_run_name
from relax.config.run import RunConfig
from relax.config.sft import SFT_GROUP, SftConfig

# The relax train flags relax sft takes (each read by the SFT run: relax.recipes.sft and the pieces it uses).
SFT_RUN_FIELDS = (
    # the model and its built-in task (tokenizer, evaluation problems)
    "hf_checkpoint", "task",
    # optimization
    "lr", "clip_grad", "lr_warmup_steps", "lr_decay_style", "min_lr", "weight_decay", "adam_beta1", "adam_beta2",
    "adam_eps", "seed",
    # backend, precision, adapters, micro-batches
    "backend", "bf16", "recompute_activations", "lora_rank", "lora_alpha", "lora_dropout", "lora_target_modules",
    "micro_batch_size", "max_tokens_per_micro_batch",
    # outputs and logging
    "load", "output_dir", "overwrite_output_dir", "run_name", "save_interval", "keep_checkpoints", "progress",
    "log_interval", "use_tensorboard", "use_wandb", "wandb_project", "wandb_group", "wandb_run_name",
    "log_completions",
    # evaluation (relax train's)
    "evaluate", "eval_prompt_data", "eval_input_key", "eval_label_key", "eval_metadata_key", "eval_interval",
    "eval_before_train", "eval_n_samples_per_prompt", "eval_temperature", "eval_top_p", "eval_max_response_len",
    "eval_pass_threshold", "custom_rm_path",
)
SFT_METHOD = "sft"  # the default run name's label
SFT_LOAD_HELP = ("continue a stopped relax sft run from its checkpoint (a run directory: its latest; or a "
                 "checkpoints/step_* directory) in that run's directory, at the next step, with the same --data, "
                 "--batch-size and --seed (else refused)")

SFT_DESCRIPTION = """\
Supervised fine-tuning: train the model on demonstrations (prompt/completion pairs or chat
conversations). The loss is the token-mean negative log-likelihood of the completion (or the
assistant turns) only. Same backends, LoRA, bf16, packing, checkpoints, trackers and evaluation as
relax train; the checkpoint is what relax train --load (built-in model) or --hf-checkpoint
<checkpoint>/hf (Hugging Face model) start from.

examples:
  relax sft --data demos.jsonl                            # the built-in model
  relax sft --data chats.jsonl --hf-checkpoint DIR --lora-rank 8 --bf16
  relax sft --data demos.jsonl --load outputs/<sft run>   # continue a run stopped by Ctrl-C or SIGTERM
  relax train --load outputs/<sft run>                    # RL from the fine-tuned built-in model
"""


def add_sft_arguments(parser: argparse.ArgumentParser) -> None:
    run_fields = attrs.fields_dict(RunConfig)
    titles = [SFT_GROUP] + [t for t, _ in GROUPS if any(flag_of(run_fields[n]).group == t for n in SFT_RUN_FIELDS)]
    groups = {title: parser.add_argument_group(title) for title in titles}
    for field in attrs.fields(SftConfig):
        _add_flag(groups[SFT_GROUP], field)
    for name in SFT_RUN_FIELDS:
        if name == "load":  # relax train's field, with what it means here
            groups[flag_of(run_fields[name]).group].add_argument(
                "--load", dest="load", default=None, metavar="DIR", help=SFT_LOAD_HELP)
            continue
        _add_flag(groups[flag_of(run_fields[name]).group], run_fields[name])
    parser.add_argument("--dry-run", dest="dry_run", action="store_true",
                        help="check everything (the data included), print the settings as YAML and exit")


def sft_config_of(args: argparse.Namespace) -> SftConfig:
    return SftConfig(**{f.name: getattr(args, f.name) for f in attrs.fields(SftConfig)})


def run_config_of(args: argparse.Namespace, num_steps: int) -> tuple[RunConfig, type]:
    """``relax train``'s ``RunConfig`` of the shared flags (its derived defaults filled in by the same
    code), ``num_rollout`` being the SFT steps."""
    ns = build_train_parser().parse_args([])
    for name in SFT_RUN_FIELDS:
        setattr(ns, name, getattr(args, name))
    if args.load and not args.output_dir and not args.run_name:  # continue in the loaded run's directory
        from relax.runtime.files.run_dir import run_of_checkpoint

        owner = run_of_checkpoint(args.load)
        ns.output_dir = str(owner) if owner is not None else None
    ns.run_name = args.run_name or default_run_name(SFT_METHOD)
    ns.num_rollout, ns.num_steps_per_rollout = num_steps, 1
    return build_run_config(ns)


def _errors_of(sft: SftConfig) -> list[str]:
    errors = [f"argument {flag_name(f)}: {problem}" for f, _, problem in field_problems(sft)]
    if sft.data is None:
        errors.append("--data is required: a .jsonl or .parquet file of demonstrations")
    elif not Path(sft.data).exists():
        errors.append(f"--data {sft.data}: no such file or directory")
    return errors


def prepare(args: argparse.Namespace, parser: argparse.ArgumentParser):
    """-> ``(RunConfig, SftConfig, examples, pad_id)``; exits with status 2 on the first problem."""
    from relax.recipes.sft import total_steps
    from relax.recipes.sft_resume import check_resume, data_fingerprint
    from relax.rollout.data import PromptDataError
    from relax.rollout.sft_data import demonstrations_of
    from relax.runtime.checks.validation import ConfigError, validate
    from relax.runtime.files.checkpoint_files import CheckpointError
    from relax.runtime.preflight import PreflightError

    sft = sft_config_of(args)
    errors = _errors_of(sft)
    if errors:
        parser.error(errors[0] if len(errors) == 1 else "invalid configuration:\n" + "\n".join(f"  - {e}" for e in errors))
    try:
        config, algorithm = run_config_of(args, num_steps=1)
        tokenizer, warnings = sft_preflight(config)
        examples = demonstrations_of(sft, tokenizer)
        config = attrs.evolve(config, num_rollout=total_steps(len(examples), sft))
        if config.load:
            check_resume(config, sft, data_fingerprint(sft.data))
        # relax train's rules, but not its batch shape: an SFT step is --batch-size demonstrations, not a
        # rollout of prompt groups, and any --micro-batch-size splits it (the last micro-batch may be smaller)
        for warning in validate(attrs.evolve(config, micro_batch_size=None), algorithm) + warnings:
            print(f"{parser.prog}: warning: {warning}", file=sys.stderr)
        pp, micro = config.pipeline_model_parallel_size, config.micro_batch_size
        if pp > 1 and micro and (sft.batch_size % micro or len(examples) % sft.batch_size % micro):
            parser.error(f"--micro-batch-size {micro} must divide every batch of --batch-size {sft.batch_size} "
                         f"(and the last batch of an epoch of {len(examples)} demonstrations) with "
                         f"--pipeline-model-parallel-size {pp}: a pipeline's micro-batches all have the same size")
    except ConfigError as exc:
        parser.error(exc.errors[0] if len(exc.errors) == 1 else
                     "invalid configuration:\n" + "\n".join(f"  - {e}" for e in exc.errors))
    except (PreflightError, PromptDataError, CheckpointError, FileNotFoundError, ValueError, ImportError) as exc:
        parser.error(str(exc))
    return config, sft, examples, tokenizer.pad_id


def sft_preflight(config: RunConfig):
    """``relax train``'s pre-flight checks of what an SFT run uses (output directory, trackers, model
    directory, tokenizer, evaluation prompts and their reward; no training prompts, no Ray) ->
    ``(tokenizer, warnings)``; the first problem raises ``PreflightError``."""
    from relax.runtime.preflight.model import check_hf_dir, check_model, load_tokenizer
    from relax.runtime.preflight.outputs import check_output, check_trackers
    from relax.runtime.preflight.prompts import check_eval_prompts
    from relax.runtime.preflight.rewards import check_reward

    warnings: list[str] = []
    check_output(config)
    check_trackers(config)
    if config.hf_checkpoint:
        check_hf_dir(config.hf_checkpoint, "--hf-checkpoint")
    tokenizer = load_tokenizer(config)
    check_model(config, tokenizer)
    eval_prompts = check_eval_prompts(config, tokenizer, warnings)
    if eval_prompts:
        check_reward(config, eval_prompts)
    return tokenizer, warnings


def settings_of(config: RunConfig, sft: SftConfig) -> dict:
    """The run's settings as flags (``dest: value``): the demonstrations' and the shared ones."""
    values = {f.name: getattr(sft, f.name) for f in attrs.fields(SftConfig)}
    values.update({name: getattr(config, name) for name in SFT_RUN_FIELDS})
    return {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}


def run_sft_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    config, sft, examples, pad_id = prepare(args, parser)
    settings = yaml.safe_dump(settings_of(config, sft), sort_keys=False)
    if args.dry_run:
        print(settings, end="")
        return 0
    from relax.config.output_dir import output_dir_of
    from relax.recipes.sft import run_sft
    from relax.recipes.sft_resume import SftInterrupted
    from relax.runtime.files.run_dir import RunDirError, lock_run_dir

    out = output_dir_of(config)
    try:
        lock = lock_run_dir(out, resuming=config.load or False, overwrite=config.overwrite_output_dir)
    except RunDirError as exc:
        parser.error(str(exc))
    try:
        (out / "sft.yaml").write_text("# relax sft settings (flag dest: value)\n" + settings)
        run_sft(config, sft, examples, pad_id)
    except SftInterrupted as exc:  # the last finished step is saved (relax.recipes.sft says where)
        print(f"relax sft: stopped ({signal.Signals(exc.signum).name})", file=sys.stderr)
        return 128 + exc.signum
    except KeyboardInterrupt:  # a second signal: stopped at once, unsaved
        print("relax sft: interrupted", file=sys.stderr)
        return 130
    finally:
        lock.release()
    return 0


def sft_parser(commands) -> argparse.ArgumentParser:
    parser = commands.add_parser(
        "sft", allow_abbrev=False, help="supervised fine-tuning on demonstrations", description=SFT_DESCRIPTION,
        formatter_class=HelpFormatter, usage="relax sft --data FILE.jsonl [options]   (relax sft --help lists every flag)",
    )
    add_sft_arguments(parser)
    return parser
