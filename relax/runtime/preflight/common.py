"""What every pre-flight check shares: its error, the one-line form of an exception, the built-in
task, and silence while transformers loads things."""

from __future__ import annotations

import contextlib
import io

from relax.config.run import RunConfig
from relax.runtime.checks.validation import ConfigError


class PreflightError(ConfigError):
    """A problem found before any process starts (``relax train`` exits with status 2)."""

    def __init__(self, message: str):
        super().__init__([message])

    def __reduce__(self):
        return (type(self), (self.errors[0],))


def first_line(exc: BaseException) -> str:
    """The exception's message (its first argument when that is the text), or its type's name."""
    text = str(exc.args[0]) if len(exc.args) == 1 and isinstance(exc.args[0], str) else str(exc)
    return text.strip() or type(exc).__name__


def builtin_task(config: RunConfig):
    """The built-in ``--task`` (used for the tokenizer, prompts or reward the run does not get elsewhere)."""
    from relax.rollout.tasks import get_task

    try:
        return get_task(config.task)
    except KeyError as exc:
        raise PreflightError(first_line(exc)) from None


@contextlib.contextmanager
def quiet():
    """Silence transformers' progress bars and warnings while pre-flight loads things."""
    with contextlib.redirect_stderr(io.StringIO()):
        yield
