"""``relax`` entry point: ``relax train``, ``relax sft``, ``relax algorithms``, ``relax plot`` and ``relax cluster``.

A rejected configuration exits with status 2 and the message on stderr (the argparse convention),
before any process starts: validation (``validation.py``), then pre-flight (``preflight.py``: data,
tokenizer, model directory, reward function, output directory, checkpoint), both also in
``--dry-run``. ray is imported only once ``relax train`` hands an accepted configuration to
``relax.runtime.driver.train.run``. A failure at run time exits with status 1 and one ``relax train: error:``
line; Ctrl-C exits with 130, SIGTERM with 143 and SIGHUP (a closed terminal) with 129, all after the
same clean shutdown that saves the last trained step, whatever became of stdout and stderr.
``relax train --load RUN_DIR`` resumes with the run's own ``config.yaml`` as the base; flags given
with it override the file, as with ``--config``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path

import yaml

from relax.cli.algorithms_cmd import add_algorithms_arguments, run_algorithms
from relax.cli.arguments import HelpFormatter, add_train_arguments, method_of_command_line
from relax.cli.build import build_run_config, foreign_flag_warnings
from relax.cli.cluster_cmd import add_cluster_arguments, run_cluster
from relax.cli.config_file import (
    EFFECTIVE_CONFIG_NAME,
    ConfigFileError,
    config_to_dict,
    read_config_file,
    write_effective_config,
)
from relax.cli.plot import add_plot_arguments, run_plot, write_run_plot
from relax.cli.preflight import PreflightError, preflight
from relax.cli.sft_cmd import run_sft_command, sft_parser
from relax.cli.suggest import closest
from relax.config.run import RunConfig
from relax.runtime.checks.validation import ConfigError, resolve_batch_shape, validate
from relax.runtime.data.environment import apply_environment_defaults

TRAIN_DESCRIPTION = """\
Train a policy with an RL method. Everything is checked before any process starts; a rejected
configuration exits with status 2 and says which flag to change.

examples:
  relax train                                     # GRPO on the built-in task and tiny model
  relax train --advantage-estimator gdpo --reward-keys correct format
  relax train --config run.yaml --lr 1e-4         # flags override the file
  relax train --advantage-estimator my_pkg.algos:MyMethod
"""


def build_parser(algorithm=None) -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The ``relax`` parser; ``relax train``'s flags are those of ``algorithm`` (its ``Config``)."""
    # allow_abbrev=False everywhere: `--num-roll 7` must not silently become --num-rollout 7
    parser = argparse.ArgumentParser(
        prog="relax",
        description="relax: RL post-training of language models (one RL method = one class).",
        allow_abbrev=False,
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    train = commands.add_parser(
        "train",
        allow_abbrev=False,
        help="train a policy",
        description=TRAIN_DESCRIPTION,
        formatter_class=HelpFormatter,
        # the full usage line lists ~60 flags and would bury an error message; --help shows them all
        usage="relax train [options]   (relax train --help lists every flag)",
    )
    add_train_arguments(train, algorithm)
    train.add_argument(
        "--dry-run",
        dest="dry_run",
        action="store_true",
        help="validate, print the effective configuration as YAML and exit (starts nothing)",
    )
    algorithms = commands.add_parser(
        "algorithms",
        allow_abbrev=False,
        help="list the RL methods and their capabilities",
        description="List the registered RL methods and their capabilities, or show one of them.",
    )
    add_algorithms_arguments(algorithms)
    plot = commands.add_parser(
        "plot",
        allow_abbrev=False,
        help="plot the reward curves of one or several runs",
        description="Per-component reward curves against step and wall time; several runs are overlaid.",
    )
    add_plot_arguments(plot)
    cluster = commands.add_parser(
        "cluster",
        allow_abbrev=False,
        help="keep a local Ray cluster up between runs (the warm path)",
        description="Start, stop or show a kept cluster: Ray, Serve, TransferQueue and pre-started workers "
                    "stay up between runs, which join it with --ray-address.",
    )
    add_cluster_arguments(cluster)
    sft = sft_parser(commands)
    return parser, {"train": train, "algorithms": algorithms, "plot": plot, "cluster": cluster, "sft": sft}


def unrecognized_message(extras: list[str], subparser: argparse.ArgumentParser) -> str:
    """argparse's "unrecognized arguments" line, with a did-you-mean for each mistyped flag (the
    same suggestion rule as a mistyped ``--config`` key)."""
    flags = [o for action in subparser._actions for o in action.option_strings if o.startswith("--")]
    hints = []
    for extra in extras:
        word = extra.split("=", 1)[0]
        if word.startswith("-") and word not in flags:
            close = closest(word, flags)
            if close:
                hints.append(f"{word}: did you mean {close}?")
    message = f"unrecognized arguments: {' '.join(extras)}"
    return message + ("".join(f"\n  {h}" for h in hints) if hints else "; see --help for the flags")


def parse_command_line(argv: list[str], parser, subparsers) -> argparse.Namespace:
    """``parser.parse_args(argv)``, but an unknown flag gets a did-you-mean (exit 2)."""
    args, extras = parser.parse_known_args(argv)
    if extras:
        command_parser = subparsers.get(args.command, parser)
        command_parser.error(unrecognized_message(extras, command_parser))
    return args


def resumed_run_config(load: str | None) -> Path | None:
    """``--load`` without ``--config`` resumes with the settings the run was started with: the
    ``config.yaml`` of the run directory the checkpoint belongs to (None when there is none)."""
    from relax.models.initial_weights import sft_checkpoint
    from relax.runtime.files.run_dir import run_of_checkpoint

    if sft_checkpoint(load) is not None:  # a `relax sft` checkpoint: a new run starts from its weights
        return None
    run = run_of_checkpoint(load) if load else None
    path = run / EFFECTIVE_CONFIG_NAME if run is not None else None
    return path if path is not None and path.is_file() else None


def _with_resumed_config(args: list[str]) -> list[str]:
    """``args`` for finding the method (phase one reads it from ``--config``): with ``--load`` alone,
    the method is the one in the resumed run's ``config.yaml`` (``resumed_run_config``)."""
    early = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    early.add_argument("--load", dest="load", default=None)
    early.add_argument("--config", dest="config", default=None)
    known, _ = early.parse_known_args(args)
    base = None if known.config else resumed_run_config(known.load)
    return [*args, "--config", str(base)] if base else args


def prepare_train_config(argv: list[str], parser, train_parser) -> tuple[RunConfig, argparse.Namespace]:
    """Parse, merge ``--config``, build and validate; exits with status 2 on any error."""
    subparsers = {"train": train_parser}
    args = parse_command_line(argv, parser, subparsers)
    base = args.config or resumed_run_config(args.load)
    if base:
        if not args.config:
            print(f"relax train: resuming with the settings in {base} (flags given here override them)",
                  file=sys.stderr)
        where = f"--config {base}" if args.config else f"--load {args.load}: the run's settings {base}"
        try:
            file_values = read_config_file(base, train_parser)
        except ConfigFileError as exc:
            train_parser.error(f"{where}: {exc}")
        # The file's values become defaults, so flags given on the command line win; the merged
        # result is validated below exactly like a command line.
        train_parser.set_defaults(**file_values)
        args = parse_command_line(argv, parser, subparsers)
    try:
        config, algorithm = build_run_config(args)
        for warning in foreign_flag_warnings(args, algorithm) + validate(config, algorithm):
            print(f"{train_parser.prog}: warning: {warning}", file=sys.stderr)
        config = resolve_batch_shape(config, algorithm)
    except ConfigError as exc:
        if len(exc.errors) == 1:
            train_parser.error(exc.errors[0])
        train_parser.error("invalid configuration:\n" + "\n".join(f"  - {e}" for e in exc.errors))
    return config, args


def run_preflight(config: RunConfig, train_parser) -> None:
    """Pre-flight checks (``relax.cli.preflight``); exits with status 2 on the first problem."""
    from relax.algorithms import load_algorithm

    try:
        warnings = preflight(config, load_algorithm(config.advantage_estimator))
    except PreflightError as exc:
        train_parser.error(str(exc))
    for warning in warnings:
        print(f"{train_parser.prog}: warning: {warning}", file=sys.stderr)


def run_train(config: RunConfig):
    """Lock the output directory, write ``<output_dir>/config.yaml`` and start the runtime (imported
    here: it imports ray). The lock is taken first, so a second run on the same directory is refused
    before it touches the first one's files."""
    from relax.config.output_dir import output_dir_of
    from relax.runtime.files.run_dir import lock_run_dir

    lock = lock_run_dir(output_dir_of(config), resuming=config.load or False, overwrite=config.overwrite_output_dir)
    try:
        path = write_effective_config(config)
        print(f"relax train: effective configuration written to {path}", file=sys.stderr)
        from relax.runtime.driver.train import run

        try:
            return run(config)
        finally:
            write_run_plot(config.output_dir)  # <output_dir>/rewards.png when matplotlib is installed
    finally:
        lock.release()


class _Terminated(KeyboardInterrupt):
    """SIGTERM (or SIGHUP: the terminal closed), delivered as a KeyboardInterrupt so that the run
    shuts down, and saves, exactly like on Ctrl-C."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _on_terminate(signum, frame):
    raise _Terminated(signum)


def _handle_termination() -> dict:
    """Turn SIGTERM, and SIGHUP unless it is ignored (``nohup``), into ``_Terminated``; returns the
    handlers to put back. Only the main thread may set signal handlers."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, _on_terminate)}
    if signal.getsignal(signal.SIGHUP) == signal.SIG_DFL:
        previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, _on_terminate)
    return previous


def _run_error_message(exc: BaseException) -> str | None:
    """One line for a failure relax knows how to describe, else None (the traceback is shown)."""
    from relax.runtime.files.checkpoint_files import CheckpointError
    from relax.runtime.files.run_errors import RunFailed
    from relax.runtime.session.waits import WorkerDied

    if isinstance(exc, WorkerDied):
        cause = getattr(exc.__cause__, "cause", None)  # a RayTaskError's original exception
        if isinstance(cause, BaseException):
            head = str(exc).split(":", 1)[0]  # "the rollout worker failed"
            return f"{head}: {type(cause).__name__}: {cause}"
        return str(exc).split("\n", 1)[0]
    if isinstance(exc, (CheckpointError, ConnectionError, RunFailed)):
        return str(exc)
    if type(exc) is Exception and "timed out during startup" in str(exc):  # raised by ray._private.node
        return ("Ray did not start: its node timed out during start-up (the raylet or the GCS did not answer "
                "within 30 s, which an overloaded machine does); retry when the machine is less busy, or start Ray "
                "yourself (`ray start --head --num-cpus N`) and pass --ray-address")
    return None


def _make_cwd_importable() -> None:
    """``relax`` is a console script, so Python does not put the working directory on ``sys.path``;
    user code named by ``--advantage-estimator pkg.mod:Class`` or ``--custom-rm-path`` lives there.
    (The runtime passes the same directory on to every Ray worker.)"""
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _make_cwd_importable()
    # Ray reads some of these once, at its import (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER decides which
    # address a driver joining `--ray-address 127.0.0.1:PORT` dials): set them before anything imports it.
    apply_environment_defaults()
    if argv[:1] == ["train"]:
        try:  # the method's own flags join the parser: find the method first
            parser, subparsers = build_parser(method_of_command_line(_with_resumed_config(argv[1:])))
        except ValueError as exc:
            build_parser()[1]["train"].error(str(exc))
        train_parser = subparsers["train"]
        config, args = prepare_train_config(argv, parser, train_parser)
        run_preflight(config, train_parser)
        if args.dry_run:
            print(yaml.safe_dump(config_to_dict(config), sort_keys=False), end="")
            return 0
        from relax.runtime.files.console import guarded_output
        from relax.runtime.files.run_dir import RunDirError

        previous = _handle_termination()
        # A reader that is gone (`| tee` hit by the same Ctrl-C, a closed terminal) must not stop the
        # save: output to it is dropped from then on (relax.runtime.files.console).
        with guarded_output():
            try:
                run_train(config)
            except RunDirError as exc:  # another run took the directory after pre-flight
                train_parser.error(str(exc))
            except _Terminated as exc:
                name = signal.Signals(exc.signum).name
                print(f"relax train: terminated ({name}); the workers were shut down", file=sys.stderr)
                return 128 + exc.signum
            except KeyboardInterrupt:  # the runtime has already shut its processes down cleanly
                print("relax train: interrupted", file=sys.stderr)
                return 130
            except Exception as exc:
                message = _run_error_message(exc)
                details = getattr(exc, "relax_details", None)  # the user's frames (relax.runtime.files.user_errors)
                if message is None and not details:
                    raise  # not the user's code and not a failure relax describes: show the traceback
                for line in details or ():
                    print(line, file=sys.stderr)
                print(f"relax train: error: {message or f'{type(exc).__name__}: {exc}'}", file=sys.stderr)
                return 1
            finally:
                for signum, handler in previous.items():
                    signal.signal(signum, handler)
        return 0
    parser, subparsers = build_parser()
    args = parse_command_line(argv, parser, subparsers)
    if args.command == "plot":
        return run_plot(args, subparsers["plot"])
    if args.command == "algorithms":
        return run_algorithms(args, subparsers["algorithms"])
    if args.command == "cluster":
        return run_cluster(args, subparsers["cluster"])
    if args.command == "sft":
        return run_sft_command(args, subparsers["sft"])
    parser.error(f"unknown command {args.command!r}")  # unreachable: argparse checks choices


if __name__ == "__main__":
    sys.exit(main())
