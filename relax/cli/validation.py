"""The configuration rules of ``relax train``: ``relax.runtime.validation``, re-exported.

The rules live in the runtime layer so that ``relax.runtime.train.run(config)`` applies the same ones
to a ``RunConfig`` built in Python (the runtime must not import the CLI).
"""

from relax.runtime.batch_shape import DEFAULT_STEPS_PER_ROLLOUT, BatchShape, batch_shape  # noqa: F401
from relax.runtime.validation import (  # noqa: F401
    EXAMPLE_REWARD_KEYS,
    FLOAT32_MAX,
    RULES,
    SEED_MAX,
    ConfigError,
    describe,
    resolve_batch_shape,
    validate,
)
