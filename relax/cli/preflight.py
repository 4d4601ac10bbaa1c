"""Pre-flight of ``relax train``: ``relax.runtime.preflight``, re-exported.

The checks live in the runtime layer so that ``relax.runtime.driver.train.run(config)`` applies the same ones
to a ``RunConfig`` built in Python (the runtime must not import the CLI).
"""

from relax.runtime.preflight import PreflightError, preflight  # noqa: F401
