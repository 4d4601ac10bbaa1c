"""Loading an object named on the command line as ``package.module:attribute``.

The bottom of the package: standard library only, so every layer (algorithms, rollout, cli) may
import it. One function, so that a user's algorithm class and a user's reward hook fail the same
way: every error is a ``ValueError`` naming the spec (and the flag, when the caller gives one) and
saying which of four things went wrong: the spec is malformed, its module is not found, its module
raised while importing, or the module lacks the attribute.
"""

from __future__ import annotations

import importlib

_PYTHONPATH_HINT = (
    "Make sure it is on PYTHONPATH (or installed) in every process; relax makes the current directory "
    "importable and, when it joins a cluster (--ray-address), ships the modules named by its flags."
)


def load_attribute(
    spec: str,
    what: str | None = None,
    *,
    expected: str = "'package.module:attribute'",
    allow_dotted: bool = False,
) -> object:
    """Import ``package.module:attribute`` and return the attribute.

    Args:
        spec: ``package.module:attribute``; with ``allow_dotted`` also ``package.module.attribute``
            (the last dotted component is the attribute), the form upstream configs use.
        what: the flag the spec came from (e.g. ``"--custom-rm-path"``); every message then starts
            with ``<what> '<spec>': ``. Without it (a caller that adds its own context, such as the
            command line's ``argument --advantage-estimator:``) messages start with the problem
            and name the spec right after it.
        expected: the accepted form with an example, shown when ``spec`` is malformed.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(
            f"{what} needs {expected}, got {spec!r}" if what else f"Expected {expected}, got {spec!r}"
        )
    if ":" in spec or not allow_dotted:
        module_name, _, attr = spec.partition(":")
    else:
        module_name, _, attr = spec.rpartition(".")
    if not module_name or not attr or ":" in attr:
        raise ValueError(
            f"{what} {spec!r} is malformed: expected {expected}"
            if what
            else f"Malformed path {spec!r}: expected {expected}"
        )
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        if isinstance(exc, ModuleNotFoundError) and _names_module(exc.name, module_name):
            raise ValueError(
                _message(what, spec, f"cannot import module {module_name!r}", f": {exc}. {_PYTHONPATH_HINT}")
            ) from exc
        # The module exists but failed while importing (a missing dependency of it included).
        raise ValueError(
            _message(what, spec, f"importing module {module_name!r}", f" raised {type(exc).__name__}: {exc}")
        ) from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        public = sorted(n for n, v in vars(module).items() if not n.startswith("_") and callable(v))
        listing = f". Its public callables: {', '.join(public) or 'none'}."
        raise ValueError(
            _message(what, spec, f"module {module_name!r} has no attribute {attr!r}", listing)
        ) from None


def _names_module(missing: str | None, module_name: str) -> bool:
    """Is the missing module ``module_name`` itself or one of its parent packages?"""
    return missing is None or module_name == missing or module_name.startswith(missing + ".")


def _message(what: str | None, spec: str, problem: str, detail: str) -> str:
    """``<what> '<spec>': <problem><detail>``, or ``<Problem> (loading '<spec>')<detail>``."""
    if what:
        return f"{what} {spec!r}: {problem}{detail}"
    return f"{problem[0].upper()}{problem[1:]} (loading {spec!r}){detail}"
