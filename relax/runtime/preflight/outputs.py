"""Pre-flight of where the run writes and what it resumes: ``--output-dir``, ``--use-wandb``'s
directory, ``--load`` and the resumed run's ``metrics.jsonl``."""

from __future__ import annotations

from relax.config.run import RunConfig
from relax.runtime.preflight.common import PreflightError, first_line


def check_output(config: RunConfig) -> None:
    from relax.config.output_dir import output_dir_of
    from relax.runtime.files.run_dir import RunDirError, check_output_dir

    try:
        check_output_dir(output_dir_of(config), resuming=config.load or False, overwrite=config.overwrite_output_dir)
    except RunDirError as exc:
        raise PreflightError(str(exc)) from None


def check_load(config: RunConfig, algorithm) -> None:
    if not config.load:
        return
    if _starts_from_sft(config):
        return
    from relax.runtime.checks import roles as R
    from relax.runtime.files.checkpoint_files import CheckpointError, check_checkpoint, read_checkpoint

    try:
        _, state = read_checkpoint(config.load)
        layout = R.derive_roles(algorithm, config)
        check_checkpoint(config, state, config.load, has_critic=R.CRITIC in layout)
    except (CheckpointError, KeyError, TypeError) as exc:
        if isinstance(exc, CheckpointError):
            raise PreflightError(str(exc)) from None
        raise PreflightError(
            f"--load {config.load}: the checkpoint does not have the layout this relax writes "
            f"({type(exc).__name__}: {first_line(exc)}); load a checkpoint written by this version of relax"
        ) from None


def _starts_from_sft(config: RunConfig) -> bool:
    """``--load`` of a ``relax sft`` checkpoint: the run starts from its weights (nothing to resume);
    refused when they are not the weights of this run's model."""
    from relax.models.initial_weights import HF_MODEL_DIR, sft_checkpoint

    marker = sft_checkpoint(config.load)
    if marker is None:
        return False
    if marker.get("model") != "tiny":
        raise PreflightError(
            f"--load {config.load}: a relax sft checkpoint of a Hugging Face model; start from it with "
            f"--hf-checkpoint {marker['dir'] / HF_MODEL_DIR} instead of --load"
        )
    if config.hf_checkpoint:
        raise PreflightError(
            f"--load {config.load} holds the built-in model's weights (a relax sft checkpoint), which "
            f"--hf-checkpoint {config.hf_checkpoint} would replace; drop one of the two flags"
        )
    if marker.get("task") != config.task:
        raise PreflightError(
            f"--load {config.load}: the relax sft checkpoint trained the built-in model of --task "
            f"{marker.get('task')}, this run has --task {config.task}; pass --task {marker.get('task')}"
        )
    return True


def check_resume_metrics(config: RunConfig, warnings: list[str]) -> None:
    """``--load`` of a run directory: its ``metrics.jsonl`` is read as the resumed run will read it (a
    partial last line is dropped with a warning; other damage names the file and the line)."""
    if not config.load:
        return
    from relax.runtime.files.metrics_log import MetricsFileError, read_metrics
    from relax.runtime.files.run_dir import run_of_checkpoint

    owner = run_of_checkpoint(config.load)
    if owner is None or not (owner / "metrics.jsonl").is_file():
        return
    try:
        _, warning = read_metrics(owner / "metrics.jsonl")
    except (MetricsFileError, OSError) as exc:
        raise PreflightError(f"--load {config.load}: {first_line(exc)}") from None
    if warning:
        warnings.append(f"--load {config.load}: {warning}")


def check_trackers(config: RunConfig) -> None:
    """``--use-wandb`` writes ``<output-dir>/wandb``: it must be (or become) a directory."""
    if not config.use_wandb:
        return
    from relax.config.output_dir import output_dir_of

    where = output_dir_of(config) / "wandb"
    if where.exists() and not where.is_dir():
        raise PreflightError(
            f"--use-wandb writes its run to {where}, which is a file, not a directory; move the file away or "
            "choose another --output-dir"
        )
