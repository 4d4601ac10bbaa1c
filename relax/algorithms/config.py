"""Transitional: ``AlgorithmConfig`` lives in ``relax.config.algorithm``."""

from relax.config.algorithm import *  # noqa: F401,F403
from relax.config.algorithm import (  # noqa: F401
    GDPO_AXIS_DEFAULTS,
    GDPO_BASELINES,
    GDPO_CONSTANT_COMPONENTS,
    GDPO_GROUP,
    GDPO_PRESET_AXES,
    GDPO_PRESETS,
    GDPO_WHITEN_SCOPES,
    GDPO_WHITEN_UNITS,
    AlgorithmConfig,
)
