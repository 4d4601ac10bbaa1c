"""The configuration layer, at the bottom of the package: the run's settings (``relax.config.run``),
the hyper-parameters every method shares (``relax.config.algorithm``) and the field rules
(``relax.config.fields``).

Each setting is one attrs field that declares its flag and its rule once; every layer above imports
the configuration type it reads. Standard library and attrs only.
"""

from relax.config.algorithm import AlgorithmConfig
from relax.config.fields import OneOf, Range, flag, flag_name
from relax.config.run import RunConfig

__all__ = ["AlgorithmConfig", "OneOf", "Range", "RunConfig", "flag", "flag_name"]
