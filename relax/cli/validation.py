"""The configuration rules of ``relax train``: ``relax.runtime.validation``, re-exported.

The rules live in the runtime layer so that ``relax.runtime.train.run(config)`` applies the same ones
to a ``RunConfig`` built in Python (the runtime must not import the CLI).
"""

from relax.runtime.validation import (  # noqa: F401
    DEFAULT_STEPS_PER_ROLLOUT,
    EXAMPLE_REWARD_KEYS,
    FLOAT32_MAX,
    RULES,
    SEED_MAX,
    BatchShape,
    ConfigError,
    batch_shape,
    describe,
    resolve_batch_shape,
    validate,
)
