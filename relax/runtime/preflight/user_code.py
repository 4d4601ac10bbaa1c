"""Pre-flight of the user's code the run will call besides the reward function: the method's
constructor and the reward hooks."""

from __future__ import annotations

from relax.config.run import RunConfig
from relax.runtime.preflight.common import PreflightError, first_line


def check_algorithm(config: RunConfig, algorithm) -> None:
    """Every process builds ``algorithm(config.algorithm)``; a constructor that raises fails here once."""
    try:
        algorithm(config.algorithm)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - a user's constructor: report whatever it raised
        raise PreflightError(
            f"--advantage-estimator {config.advantage_estimator}: {algorithm.__name__}(config) raised "
            f"{type(exc).__name__}: {first_line(exc).splitlines()[0]}"
        ) from None


def check_hooks(config: RunConfig) -> None:
    """``--dynamic-sampling-filter-path`` / ``--custom-reward-post-process-path``: each hook can be
    called with the arguments the rollout passes it (``relax.rollout.hooks.HOOK_ARGUMENTS``)."""
    from relax.importing import load_attribute
    from relax.rollout.hooks import FILTER_FLAG, POST_PROCESS_FLAG, HookError, check_hook_signature

    for spec, flag in ((config.dynamic_sampling_filter_path, FILTER_FLAG),
                       (config.custom_reward_post_process_path, POST_PROCESS_FLAG)):
        if not spec:
            continue
        try:
            fn = load_attribute(spec, flag, expected="'package.module:function'", allow_dotted=True)
            check_hook_signature(fn, flag, spec)
        except (HookError, ValueError, ImportError) as exc:
            raise PreflightError(first_line(exc)) from None
