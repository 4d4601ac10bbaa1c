"""The configuration rules of the method's hyper-parameters and the loss: each field's own range, the
seed, KL, the loss aggregation, the method's ``Config`` and hyper-parameters it never reads.

Each rule is ``rule(config, algorithm, who, errors, warnings)``: it appends messages to ``errors`` and
``warnings`` (``who`` is how messages name the method); ``relax.runtime.checks.validation`` runs them all.
"""

from __future__ import annotations

import attrs

from relax.config.fields import field_problems, flag_name


def check_field_rules(config, algorithm, who, errors, warnings):
    """Each ``RunConfig`` field's own rule (``relax.config.fields``): what the flag's parser enforces
    on the command line, for a ``RunConfig`` built in Python (the hyper-parameters' ``Config`` checks
    its rules when it is built)."""
    for field, value, problem in field_problems(config):
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        what = "is out of range" if number else f"is a {type(value).__name__} (in Python, pass the value itself)"
        errors.append(f"argument {flag_name(field)}: {value!r} {what}; it {problem}")


def check_kl(config, algorithm, who, errors, warnings):
    a = config.algorithm
    if a.kl_coef != 0 and a.kl_loss_coef != 0:
        errors.append(
            f"Only one of --kl-coef ({a.kl_coef}) and --kl-loss-coef ({a.kl_loss_coef}) can be set: use "
            "--kl-coef for reward-side KL shaping, or --use-kl-loss --kl-loss-coef for a KL loss term"
        )
    if algorithm.forbids_reward_side_kl and a.kl_coef != 0:
        errors.append(
            f"{who} does not support a nonzero --kl-coef (got {a.kl_coef}): reward-side KL shaping is not "
            "part of this method. Set --kl-coef 0; for a KL penalty use --use-kl-loss --kl-loss-coef COEF"
        )
    if a.kl_loss_coef != 0 and not a.use_kl_loss:
        warnings.append(f"--kl-loss-coef {a.kl_loss_coef} has no effect without --use-kl-loss")
    if a.use_kl_loss and a.kl_loss_coef == 0:
        warnings.append("--use-kl-loss with --kl-loss-coef 0 adds nothing to the loss; set --kl-loss-coef")


def check_loss(config, algorithm, who, errors, warnings):
    aggregation = config.algorithm.loss_aggregation
    if algorithm.requires_global_token_loss and aggregation != "token_mean":
        errors.append(
            f"{who} requires the loss to be normalized by the global number of valid response tokens: "
            f"use --loss-aggregation token_mean (got {aggregation})"
        )
    if config.overlong_filter:
        from relax.rollout.environments import is_multi_turn

        if is_multi_turn(config):  # an episode's loss mask leaves out environment turns: no length to compare
            errors.append(
                "--overlong-filter compares a single completion's length with --rollout-max-response-len; it does "
                "not apply to multi-turn episodes (--env-path, or a task with an environment): remove it"
            )


def check_teacher(config, algorithm, who, errors, warnings):
    """``--teacher-checkpoint`` exactly when the method declares ``needs_teacher`` (the teacher role)."""
    if algorithm.needs_teacher and not config.teacher_checkpoint:
        errors.append(
            f"{who} distills a teacher (needs_teacher): pass --teacher-checkpoint DIR, the frozen teacher model "
            "(a Hugging Face directory or a relax run checkpoint with the student's tokenizer)"
        )
    if config.teacher_checkpoint and not algorithm.needs_teacher:
        errors.append(
            f"--teacher-checkpoint {config.teacher_checkpoint} would do nothing: {who} does not use a teacher "
            "(needs_teacher = False). Remove the flag, or pick a method that needs a teacher (the teacher column of "
            "`relax algorithms`)"
        )


# Fields every run reads (the rollout, the reward stage, the runtime or, for full_vocabulary_log_probs, the
# training backend), whatever the method.
_FRAMEWORK_FIELDS = frozenset({"n_samples_per_prompt", "reward_keys", "reward_weights", "rewards_normalization",
                               "full_vocabulary_log_probs"})


def check_method_config(config, algorithm, who, errors, warnings):
    """``config.algorithm`` is the method's ``Config`` (or a parent's, whose values it keeps)."""
    try:
        algorithm.config_of(config.algorithm)
    except TypeError as exc:
        errors.append(f"{who}: {exc}; build the hyper-parameters with {algorithm.__name__}.Config(...)")


def check_unused_hyperparameters(config, algorithm, who, errors, warnings):
    """A hyper-parameter set away from its default that the method never reads would silently do
    nothing (e.g. a preset of one method given to another): say so. Classes that declare no
    ``hyperparameters`` are not checked (we cannot know what they read)."""
    if not algorithm.hyperparameters:
        return
    defaults = type(config.algorithm)()
    read = set(algorithm.hyperparameters) | _FRAMEWORK_FIELDS
    for field in attrs.fields(type(config.algorithm)):
        if field.name in read or field.name == "eps_clip_high":  # eps_clip_high defaults to eps_clip
            continue
        if getattr(config.algorithm, field.name) != getattr(defaults, field.name):
            warnings.append(
                f"{who} does not read {flag_name(field)} (set to {getattr(config.algorithm, field.name)!r}); "
                "it has no effect. `relax algorithms NAME` lists the flags a method reads."
            )


# 0 .. 2**32 - 1: what every seeded generator accepts (torch, numpy, Python); each training rank adds
# its rank to it. A larger value used to fail inside a worker ("Overflow when unpacking long long").
SEED_MAX = 2**32 - 1


def check_seed(config, algorithm, who, errors, warnings):
    if not 0 <= config.seed <= SEED_MAX:
        errors.append(f"argument --seed: {config.seed} is out of range; use an integer from 0 to {SEED_MAX}")


def check_teacher_distribution(config, algorithm, who, errors, warnings):
    """A method that reads the teacher's distribution over the vocabulary (``teacher_top_k()`` not None,
    e.g. generalized JSD) needs a backend that hands the loss the student's whole distribution, and the teacher's top-k
    pass runs unsharded."""
    from relax.backends.registry import backend_entry

    try:
        top_k = algorithm(algorithm.config_of(config.algorithm)).teacher_top_k()
    except (TypeError, ValueError):  # check_method_config reports a Config that does not fit
        return
    if top_k is None:
        return
    if not backend_entry(config.backend).gives_distributions:
        errors.append(
            f"{who} compares the teacher's and the student's distributions over the vocabulary, which --backend "
            f"{config.backend} does not hand the loss; use --backend torch"
        )
    if config.sharding != "none":
        errors.append(
            f"{who} reads the teacher's top-k distribution, whose pass runs on whole (unsharded) teacher "
            f"weights; drop --sharding {config.sharding}"
        )
