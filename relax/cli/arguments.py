"""The ``relax train`` argument parser: every flag, grouped and documented.

Flag names and defaults follow upstream Relax where it has the flag (``notes/upstream-relax.md``
§4); the defaults themselves are read from ``AlgorithmConfig`` / ``RunConfig`` so the parser and the
configuration classes cannot drift apart. A flag's ``dest`` is the configuration field it sets
(``--lambd`` -> ``lam``, ``--disable-rewards-normalization`` -> ``rewards_normalization``); a
``--config`` file may use either the dest or the flag name.

Nothing here imports ray: ``relax train --help`` and validation run without it.
"""

from __future__ import annotations

import argparse
import math

import attrs

from relax.algorithms import algorithm_names
from relax.algorithms.config import KL_ESTIMATORS, LOSS_AGGREGATIONS, AlgorithmConfig
from relax.runtime.config import RunConfig

BACKENDS = ("torch", "megatron")

ALGORITHM_FIELDS = frozenset(attrs.fields_dict(AlgorithmConfig))
RUN_FIELDS = frozenset(f for f in attrs.fields_dict(RunConfig) if f != "algorithm")


def _algo_default(name: str):
    return attrs.fields_dict(AlgorithmConfig)[name].default


def _run_default(name: str):
    return attrs.fields_dict(RunConfig)[name].default


# -- value types (argparse calls them on command-line strings and on --config values) ----------


def _number(text, kind=float):
    if isinstance(text, bool):
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}")
    try:
        value = kind(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(
            f"expected {'an integer' if kind is int else 'a number'}, got {text!r}"
        )
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be finite, got {text!r}")
    return value


def finite_float(text) -> float:
    return _number(text, float)


def non_negative_float(text) -> float:
    value = _number(text, float)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
    return value


def positive_float(text) -> float:
    value = _number(text, float)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def unit_interval(text) -> float:
    value = _number(text, float)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text!r}")
    return value


def open_unit_interval(text) -> float:
    value = _number(text, float)
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text!r}")
    return value


def positive_int(text) -> int:
    value = _number(text, int)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text!r}")
    return value


def estimator_spec(text) -> str:
    """A registered algorithm name or a dotted path ``package.module:ClassName`` (loaded later)."""
    text = str(text)
    if text in algorithm_names() or ":" in text:
        return text
    raise argparse.ArgumentTypeError(
        f"unknown advantage estimator {text!r}; choose one of {', '.join(algorithm_names())} or give "
        "a dotted path 'package.module:ClassName' to your own RLAlgorithm subclass"
    )


def reward_key_name(text) -> str:
    text = str(text)
    if not text.strip():
        raise argparse.ArgumentTypeError("a reward key must be a non-empty name")
    return text


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Shows meaningful defaults (not None/False) and keeps the description's line breaks."""

    def _get_help_string(self, action):
        if action.default is None or isinstance(action.default, bool):
            return action.help
        return super()._get_help_string(action)


# -- the parser ---------------------------------------------------------------------------------


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every ``relax train`` flag to ``parser``, in documented groups."""
    names = ", ".join(algorithm_names())

    g = parser.add_argument_group("algorithm", "Which RL method runs, and its hyper-parameters.")
    g.add_argument(
        "--advantage-estimator",
        dest="advantage_estimator",
        type=estimator_spec,
        default=_run_default("advantage_estimator"),
        metavar="NAME|MODULE:CLASS",
        help=f"RL method: one of {names} (see `relax algorithms`), or a dotted path "
        "'package.module:ClassName' to your own RLAlgorithm subclass",
    )
    g.add_argument(
        "--eps-clip",
        dest="eps_clip",
        type=positive_float,
        default=_algo_default("eps_clip"),
        help="PPO clip range: the ratio is clipped to [1 - eps_clip, 1 + eps_clip_high]",
    )
    g.add_argument(
        "--eps-clip-high",
        dest="eps_clip_high",
        type=positive_float,
        default=None,
        help="upper clip range (default: --eps-clip)",
    )
    g.add_argument(
        "--eps-clip-c",
        dest="eps_clip_c",
        type=finite_float,
        default=None,
        help="dual-clip constant c > 1 for negative advantages (off when unset)",
    )
    g.add_argument(
        "--value-clip",
        dest="value_clip",
        type=non_negative_float,
        default=_run_default("value_clip"),
        help="critic value clip range (critic methods only)",
    )
    g.add_argument(
        "--kl-coef",
        dest="kl_coef",
        type=non_negative_float,
        default=_algo_default("kl_coef"),
        help="reward-side KL shaping coefficient (needs reference log-probs)",
    )
    g.add_argument(
        "--use-kl-loss",
        dest="use_kl_loss",
        action="store_true",
        help="add a KL(policy || reference) term to the loss, weighted by --kl-loss-coef",
    )
    g.add_argument(
        "--kl-loss-coef",
        dest="kl_loss_coef",
        type=non_negative_float,
        default=_algo_default("kl_loss_coef"),
        help="weight of the KL loss term (with --use-kl-loss)",
    )
    g.add_argument(
        "--kl-loss-type",
        dest="kl_loss_type",
        choices=KL_ESTIMATORS,
        default=_algo_default("kl_loss_type"),
        help="KL estimator for reward shaping and the KL loss",
    )
    g.add_argument(
        "--entropy-coef",
        dest="entropy_coef",
        type=finite_float,
        default=_algo_default("entropy_coef"),
        help="entropy bonus weight in the loss",
    )
    g.add_argument(
        "--gamma",
        dest="gamma",
        type=unit_interval,
        default=_algo_default("gamma"),
        help="discount factor (REINFORCE++ returns, GAE)",
    )
    g.add_argument(
        "--lambd", "--lam", dest="lam", type=unit_interval, default=_algo_default("lam"), help="GAE lambda"
    )
    g.add_argument(
        "--normalize-advantages",
        dest="normalize_advantages",
        action="store_true",
        help="whiten advantages over the batch (required or forbidden by some methods)",
    )
    g.add_argument(
        "--disable-grpo-std-normalization",
        dest="grpo_std_normalization",
        action="store_false",
        help="group rewards are only centred, not divided by the group std (Dr. GRPO)",
    )
    g.add_argument(
        "--disable-rewards-normalization",
        dest="rewards_normalization",
        action="store_false",
        help="skip the algorithm's reward normalization (raw rewards become the scalar reward)",
    )
    g.add_argument(
        "--loss-aggregation",
        dest="loss_aggregation",
        choices=LOSS_AGGREGATIONS,
        default=_algo_default("loss_aggregation"),
        help="how per-token losses are reduced: token_mean = over all valid tokens of the "
        "batch (global per-token loss); seq_mean_token_mean / seq_mean_token_sum = per sequence first",
    )
    g.add_argument(
        "--sapo-tau-pos",
        dest="sapo_tau_pos",
        type=positive_float,
        default=_algo_default("sapo_tau_pos"),
        help="SAPO gate temperature for positive advantages",
    )
    g.add_argument(
        "--sapo-tau-neg",
        dest="sapo_tau_neg",
        type=positive_float,
        default=_algo_default("sapo_tau_neg"),
        help="SAPO gate temperature for negative advantages",
    )
    g.add_argument(
        "--m2po-kl2-budget",
        dest="m2po_kl2_budget",
        type=non_negative_float,
        default=_algo_default("m2po_kl2_budget"),
        help="M2PO second-moment budget on harmful tokens",
    )
    g.add_argument(
        "--m2po-miniclip-low",
        dest="m2po_miniclip_low",
        type=unit_interval,
        default=_algo_default("m2po_miniclip_low"),
        help="M2PO floor of the lower clip range",
    )
    g.add_argument(
        "--m2po-miniclip-high",
        dest="m2po_miniclip_high",
        type=non_negative_float,
        default=_algo_default("m2po_miniclip_high"),
        help="M2PO floor of the upper clip range",
    )

    g = parser.add_argument_group("rewards", "Reward components and reward hooks.")
    g.add_argument(
        "--reward-keys",
        "--gdpo-reward-keys",
        dest="reward_keys",
        nargs="+",
        type=reward_key_name,
        default=None,
        metavar="KEY",
        help="reward components, in the column order the algorithm sees (default: the built-in "
        "task's components; 'reward' with --prompt-data or --custom-rm-path)",
    )
    g.add_argument(
        "--reward-weights",
        "--gdpo-reward-weights",
        dest="reward_weights",
        nargs="+",
        type=finite_float,
        default=None,
        metavar="W",
        help="one weight per reward key (default: 1.0 each)",
    )
    g.add_argument(
        "--reward-key",
        dest="reward_key",
        type=reward_key_name,
        default=None,
        help="the component logged as 'the' reward when there are several (one of --reward-keys)",
    )
    g.add_argument(
        "--custom-rm-path",
        dest="custom_rm_path",
        default=None,
        metavar="MODULE:FUNCTION",
        help="your reward function fn(prompt, completion, label, metadata) -> number or "
        "{key: number} (sync or async)",
    )
    g.add_argument(
        "--custom-reward-post-process-path",
        dest="custom_reward_post_process_path",
        default=None,
        metavar="MODULE:FUNCTION",
        help="replaces the algorithm's reward normalization (rejected where the method forbids it)",
    )
    g.add_argument(
        "--dynamic-sampling-filter-path",
        dest="dynamic_sampling_filter_path",
        default=None,
        metavar="MODULE:FUNCTION",
        help="custom filter deciding which prompt groups the rollout keeps",
    )

    g = parser.add_argument_group(
        "batch shape",
        "samples per rollout = rollout-batch-size x n-samples-per-prompt, split into num-steps-per-rollout "
        "optimizer mini-batches of global-batch-size samples (whole prompt groups each). Give at most one "
        "of --global-batch-size / --num-steps-per-rollout; when neither is given, num-steps-per-rollout is "
        "1 for methods that require on-policy updates and otherwise 2 when the groups split evenly (the "
        "embedded recipe learns fastest with two mini-batch updates per rollout), else 1.",
    )
    g.add_argument(
        "--num-rollout",
        dest="num_rollout",
        type=positive_int,
        default=_run_default("num_rollout"),
        help="training steps (one rollout each)",
    )
    g.add_argument(
        "--n-samples-per-prompt",
        dest="n_samples_per_prompt",
        type=positive_int,
        default=_algo_default("n_samples_per_prompt"),
        help="completions per prompt (group size)",
    )
    g.add_argument(
        "--rollout-batch-size",
        dest="rollout_batch_size",
        type=positive_int,
        default=_run_default("rollout_batch_size"),
        help="prompts per rollout",
    )
    g.add_argument(
        "--global-batch-size",
        dest="global_batch_size",
        type=positive_int,
        default=None,
        help="samples per optimizer step (default: derived, see above)",
    )
    g.add_argument(
        "--num-steps-per-rollout",
        dest="num_steps_per_rollout",
        type=positive_int,
        default=None,
        help="optimizer steps per rollout (default: derived, see above)",
    )
    g.add_argument(
        "--micro-batch-size",
        dest="micro_batch_size",
        type=positive_int,
        default=None,
        help="samples per forward/backward on one worker (default: the worker's whole mini-batch)",
    )

    g = parser.add_argument_group("optimization")
    g.add_argument(
        "--lr", dest="lr", type=positive_float, default=_run_default("lr"), help="actor learning rate"
    )
    g.add_argument(
        "--critic-lr",
        dest="critic_lr",
        type=positive_float,
        default=_run_default("critic_lr"),
        help="critic learning rate (critic methods only)",
    )
    g.add_argument(
        "--clip-grad",
        dest="clip_grad",
        type=non_negative_float,
        default=_run_default("clip_grad"),
        help="gradient-norm clip (0 disables)",
    )
    g.add_argument(
        "--seed",
        dest="seed",
        type=lambda s: _number(s, int),
        default=_run_default("seed"),
        help="random seed (sampling, initialization, prompt order)",
    )

    g = parser.add_argument_group("sampling")
    g.add_argument(
        "--rollout-temperature",
        dest="rollout_temperature",
        type=positive_float,
        default=_run_default("rollout_temperature"),
        help="sampling temperature",
    )
    g.add_argument(
        "--rollout-top-p",
        dest="rollout_top_p",
        type=open_unit_interval,
        default=_run_default("rollout_top_p"),
        help="nucleus sampling threshold",
    )
    g.add_argument(
        "--rollout-max-response-len",
        dest="rollout_max_response_len",
        type=positive_int,
        default=_run_default("rollout_max_response_len"),
        help="maximum generated tokens per sample",
    )

    g = parser.add_argument_group("model and data")
    g.add_argument(
        "--task",
        dest="task",
        default=_run_default("task"),
        help="built-in task (prompts, labels and reward function) used when no --prompt-data is given",
    )
    g.add_argument(
        "--hf-checkpoint",
        dest="hf_checkpoint",
        default=None,
        metavar="PATH",
        help="Hugging Face model directory (default: the built-in tiny model)",
    )
    g.add_argument(
        "--ref-load",
        dest="ref_load",
        default=None,
        metavar="PATH",
        help="reference model for KL terms (default: the initial policy)",
    )
    g.add_argument(
        "--prompt-data",
        dest="prompt_data",
        default=None,
        metavar="FILE.jsonl",
        help="prompt data set (.jsonl or .parquet) instead of the built-in task",
    )
    g.add_argument(
        "--input-key",
        dest="input_key",
        default=_run_default("input_key"),
        help="prompt field of --prompt-data records",
    )
    g.add_argument(
        "--label-key",
        dest="label_key",
        default=_run_default("label_key"),
        help="label field of --prompt-data records",
    )
    g.add_argument(
        "--metadata-key",
        dest="metadata_key",
        default=None,
        help="metadata field of --prompt-data records (passed to the reward function)",
    )
    g.add_argument(
        "--apply-chat-template",
        dest="apply_chat_template",
        action="store_true",
        help="format prompts with the tokenizer's chat template",
    )
    g.add_argument(
        "--system-prompt", dest="system_prompt", default=None, help="system message (chat template)"
    )
    g.add_argument(
        "--prompt-suffix", dest="prompt_suffix", default=None, help="text appended to every prompt"
    )
    g.add_argument(
        "--max-prompt-len",
        dest="max_prompt_len",
        type=positive_int,
        default=None,
        help="drop prompts longer than this many tokens",
    )

    g = parser.add_argument_group("placement and backends")
    g.add_argument(
        "--ray-address",
        dest="ray_address",
        default=None,
        help="Ray cluster to join (default: start a local one)",
    )
    g.add_argument(
        "--actor-num-workers",
        dest="actor_num_workers",
        type=positive_int,
        default=_run_default("actor_num_workers"),
        help="training worker processes (torch: data-parallel ranks; megatron: TP x PP x DP)",
    )
    g.add_argument(
        "--backend",
        dest="backend",
        choices=BACKENDS,
        default=_run_default("backend"),
        help="training backend; megatron needs the extra: pip install 'relax-rl[megatron]'",
    )
    g.add_argument(
        "--tensor-model-parallel-size",
        dest="tensor_model_parallel_size",
        type=positive_int,
        default=_run_default("tensor_model_parallel_size"),
        help="Megatron tensor parallelism",
    )
    g.add_argument(
        "--pipeline-model-parallel-size",
        dest="pipeline_model_parallel_size",
        type=positive_int,
        default=_run_default("pipeline_model_parallel_size"),
        help="Megatron pipeline parallelism",
    )
    g.add_argument(
        "--advantages-on-actor",
        dest="advantages_on_actor",
        action="store_true",
        help="compute advantages on the training ranks instead of the advantages service",
    )

    g = parser.add_argument_group("outputs")
    g.add_argument(
        "--output-dir",
        dest="output_dir",
        default=None,
        metavar="DIR",
        help="where checkpoints, metrics and config.yaml go (default: outputs/<run-name>)",
    )
    g.add_argument(
        "--run-name",
        dest="run_name",
        default=None,
        help="run name (default: <advantage-estimator>-<date>-<time>)",
    )
    g.add_argument(
        "--save-interval",
        dest="save_interval",
        type=positive_int,
        default=None,
        help="save a checkpoint every this many rollouts (default: only at the end)",
    )
    g.add_argument(
        "--load", dest="load", default=None, metavar="DIR", help="resume from this checkpoint directory"
    )
    g.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")

    g = parser.add_argument_group("configuration file")
    g.add_argument(
        "--config",
        dest="config",
        default=None,
        metavar="FILE.yaml",
        help="YAML mapping of flag -> value (dest names like n_samples_per_prompt or flag names "
        "like n-samples-per-prompt); flags on the command line override it",
    )

    _add_remaining_fields(parser)


def _field_type(field):
    """argparse type for a configuration field that has no hand-written flag (see below)."""
    default = field.default
    if isinstance(default, bool):
        return bool
    if isinstance(default, (int, float, str)):
        return type(default)
    text = str(field.type or "")
    for name, kind in (("float", float), ("int", int), ("str", str)):
        if name in text:
            return kind
    return str


_VALUE_TYPES = {
    "finite_float": finite_float,
    "non_negative_float": non_negative_float,
    "positive_float": positive_float,
    "unit_interval": unit_interval,
    "positive_int": positive_int,
}


def _add_remaining_fields(parser: argparse.ArgumentParser) -> None:
    """Give a flag to every AlgorithmConfig / RunConfig field that has no hand-written one yet.

    New configuration fields thereby become settable (and show up in --help) the moment they are
    added; a hand-written flag with a better help text should follow.
    """
    taken = {a.dest for a in parser._actions}
    groups: dict[str, argparse._ArgumentGroup] = {}
    for cls, fields in ((AlgorithmConfig, ALGORITHM_FIELDS), (RunConfig, RUN_FIELDS)):
        for field in attrs.fields(cls):
            if field.name not in fields or field.name in taken:
                continue
            title = field.metadata.get("group", "other settings")
            group = groups.get(title) or groups.setdefault(title, parser.add_argument_group(title))
            flag = "--" + field.name.replace("_", "-")
            kind = _field_type(field)
            default = field.default if not isinstance(field.default, attrs.Factory) else None
            if kind is bool:
                group.add_argument(
                    flag,
                    dest=field.name,
                    action=argparse.BooleanOptionalAction,
                    default=default,
                    help=f"{cls.__name__}.{field.name}",
                )
            else:
                # A field may describe its flag in attrs metadata: choices, help, metavar and a type
                # named after one of the value types above (e.g. "positive_float").
                meta = field.metadata
                if "type" in meta:
                    kind = _VALUE_TYPES[meta["type"]]
                elif kind is float:
                    kind = finite_float
                extra = {k: meta[k] for k in ("choices", "metavar") if k in meta}
                group.add_argument(
                    flag, dest=field.name, type=kind, default=default,
                    help=meta.get("help", f"{cls.__name__}.{field.name}"), **extra
                )


def build_train_parser(prog: str = "relax train", parser: argparse.ArgumentParser | None = None):
    """The ``relax train`` parser (or fill ``parser``, e.g. a subparser)."""
    if parser is None:
        parser = argparse.ArgumentParser(prog=prog, formatter_class=HelpFormatter)
    add_train_arguments(parser)
    return parser
