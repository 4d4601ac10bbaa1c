"""The algorithm layer: ``RLAlgorithm``, its capability attributes, the registry and the numerics.

Imports only the standard library, torch and attrs (never ray, megatron, transfer_queue, tensordict
or a higher relax layer): argument parsing, the advantages deployment and the training ranks all
import it, and its tests run on a bare CPU install.
"""

from relax.algorithms.base import RLAlgorithm
from relax.algorithms.capabilities import CAPABILITIES
from relax.algorithms.registry import (
    BUILTIN_ALGORITHMS,
    algorithm_names,
    get_algorithm,
    load_algorithm,
)
from relax.algorithms.types import AdvantageInputs, PolicyLossInputs, PolicyLossOutput
from relax.config.algorithm import AlgorithmConfig
from relax.config.fields import flag

__all__ = [
    "BUILTIN_ALGORITHMS",
    "CAPABILITIES",
    "AdvantageInputs",
    "AlgorithmConfig",
    "PolicyLossInputs",
    "PolicyLossOutput",
    "RLAlgorithm",
    "algorithm_names",
    "flag",
    "get_algorithm",
    "load_algorithm",
]
