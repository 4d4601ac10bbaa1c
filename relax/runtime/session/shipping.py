"""What a run ships to the workers of a cluster it joins (``--ray-address``): only the user's own
modules, named by the flags that take ``package.module:attribute`` (``USER_CODE_FLAGS``).

Shipping the whole working directory (Ray's ``working_dir``) uploads whatever the user's shell
stands in (a home directory, a data set, the cluster's own temp dir: tens of GB), and the shipped
copy of a checkout shadows the installed relax package on the workers. So by default each user
module is shipped through Ray's ``py_modules`` (a package directory, or a single ``.py`` file):
nothing installed (relax, site-packages) and nothing else. ``--ray-working-dir DIR`` ships a whole
directory when the user asks for it, at most ``SHIP_LIMIT_MB`` after the excludes; Ray's temp dir
and the run's output directory are never shipped.

File paths given relative to the driver's directory (``--prompt-data`` and the like) are made
absolute for the workers, whose working directory on a joined cluster is not the driver's.
"""

from __future__ import annotations

import importlib.util
import os
import sysconfig
from pathlib import Path

import attrs

import relax
from relax.runtime.files.run_errors import RunFailed

# RunConfig fields naming user code as `package.module:attribute` (advantage_estimator: when it has ':')
USER_CODE_FLAGS = ("advantage_estimator", "custom_rm_path", "custom_reward_post_process_path",
                   "dynamic_sampling_filter_path", "env_path")
PATH_FLAGS = ("prompt_data", "eval_prompt_data", "hf_checkpoint", "ref_load", "teacher_checkpoint")  # read by the workers
SHIP_LIMIT_MB = 100
EXCLUDES = ["__pycache__/", "*.pyc", ".git/", ".tox/", ".venv/", "*.egg-info/"]


class ShippingError(RunFailed):
    """The code for the workers cannot be shipped (too large, not found)."""


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _installed_dirs() -> tuple[str, ...]:
    names = ("stdlib", "platstdlib", "purelib", "platlib")
    return tuple({os.path.realpath(p) + os.sep for k, p in sysconfig.get_paths().items() if k in names and p})


def user_modules(config) -> dict[str, Path]:
    """``{top-level module: its package directory or .py file}`` for the user code the
    configuration names, leaving out anything installed (relax itself included: every worker has it)."""
    found: dict[str, Path] = {}
    installed = _installed_dirs()
    relax_dir = os.path.realpath(Path(relax.__file__).resolve().parent)
    for name in USER_CODE_FLAGS:
        spec = getattr(config, name, None)
        if not isinstance(spec, str) or ":" not in spec:
            continue
        top = spec.partition(":")[0].split(".", 1)[0]
        if not top or top in found:
            continue
        try:
            module_spec = importlib.util.find_spec(top)  # a top-level name: nothing is imported
        except (ImportError, ValueError):
            module_spec = None
        if module_spec is None:
            raise ShippingError(f"{_flag(name)} {spec}: module {top!r} not found from {os.getcwd()}, so it cannot be "
                                "shipped to the cluster's workers; run from the directory that holds it")
        if module_spec.submodule_search_locations:
            path = Path(next(iter(module_spec.submodule_search_locations)))
        elif module_spec.origin and module_spec.origin.endswith(".py"):
            path = Path(module_spec.origin)
        else:
            continue  # a built-in or compiled module: installed, not the user's source
        real = os.path.realpath(path)
        if real.startswith(installed) or real == relax_dir or real.startswith(relax_dir + os.sep):
            continue
        found[top] = path
    return found


def _size_mb(root: Path, skip: tuple[str, ...], limit_mb: float) -> float:
    """Bytes under ``root`` in MiB, stopping once past ``limit_mb`` (the directory may be huge)."""
    total, limit = 0, limit_mb * 2**20
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in (".git", "__pycache__", ".tox", ".venv")
                       and not (os.path.realpath(os.path.join(dirpath, d)) + os.sep).startswith(skip)]
        for filename in filenames:
            try:
                total += os.lstat(os.path.join(dirpath, filename)).st_size
            except OSError:
                continue
            if total > limit:
                return total / 2**20
    return total / 2**20


def never_shipped(config) -> tuple[str, ...]:
    """Ray's temp dir and the run's output directory (real paths, with a trailing separator)."""
    from relax.config.output_dir import output_dir_of

    dirs = [os.environ.get("RAY_TMPDIR") or "/tmp/ray", str(output_dir_of(config))]
    return tuple(os.path.realpath(d) + os.sep for d in dirs)


def cluster_runtime_env(config) -> dict:
    """The ``runtime_env`` entries that ship code to a joined cluster: ``py_modules`` (the user's
    modules), or ``working_dir`` with ``--ray-working-dir``; each checked against ``SHIP_LIMIT_MB``."""
    skip = never_shipped(config)
    working_dir = getattr(config, "ray_working_dir", None)
    if working_dir:
        root = Path(working_dir)
        if not root.is_dir():
            raise ShippingError(f"--ray-working-dir {working_dir}: not a directory")
        relative = [os.path.relpath(d.rstrip(os.sep), root) for d in skip
                    if os.path.realpath(d).startswith(os.path.realpath(root) + os.sep)]
        size = _size_mb(root, skip, SHIP_LIMIT_MB)
        if size > SHIP_LIMIT_MB:
            raise ShippingError(
                f"--ray-working-dir {working_dir} holds more than {SHIP_LIMIT_MB} MiB (after excluding .git, "
                "__pycache__, the output directory and Ray's temp dir): Ray would zip and upload all of it to every "
                "node. Point it at the directory of your code only, or drop it: relax ships the modules named by "
                f"{', '.join(_flag(f) for f in USER_CODE_FLAGS)} by itself"
            )
        return {"working_dir": str(root), "excludes": EXCLUDES + [r.rstrip("/") + "/" for r in relative]}
    modules = user_modules(config)
    for top, path in modules.items():
        size = _size_mb(path, skip, SHIP_LIMIT_MB) if path.is_dir() else path.stat().st_size / 2**20
        if size > SHIP_LIMIT_MB:
            raise ShippingError(f"module {top!r} ({path}) holds more than {SHIP_LIMIT_MB} MiB; relax ships a user "
                                "module to every node of the cluster: move data files out of the package")
    if not modules:
        return {}
    return {"py_modules": [str(p) for p in modules.values()], "excludes": EXCLUDES}


def with_absolute_paths(config):
    """``config`` with the worker-read file paths that exist relative to this directory made absolute."""
    changes = {name: os.path.abspath(value) for name in PATH_FLAGS
               if isinstance(value := getattr(config, name, None), str) and not os.path.isabs(value)
               and os.path.exists(value)}
    return attrs.evolve(config, **changes) if changes else config
