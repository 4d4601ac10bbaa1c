"""Did-you-mean for a name relax does not know: a ``--config`` key or a ``relax train`` flag.

One rule for both, so a typo gets the same help on the command line as in a YAML file.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest(word: str, candidates: Iterable[str]) -> str | None:
    """The candidate closest to ``word`` (difflib's ratio of at least 0.6), or None."""
    close = difflib.get_close_matches(word, sorted(set(candidates)), n=1)
    return close[0] if close else None
