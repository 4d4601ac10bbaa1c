"""The built-in algorithms, listed explicitly; name lookup and dotted-path loading.

No decorator and no import side effect decides what exists: ``BUILTIN_ALGORITHMS`` is the list.
Every process (rollout, advantages deployment, each training rank) resolves the same spec string
with ``load_algorithm`` and instantiates the class itself; nothing pickles a live algorithm.
"""

from __future__ import annotations

from relax.algorithms.base import RLAlgorithm
from relax.algorithms.distill import OnPolicyDistill
from relax.algorithms.gdpo import GDPO
from relax.algorithms.gdpo_presets import GDPONVLabsTRL, GDPONVLabsVerl  # noqa: F401 - GDPO.PRESETS
from relax.algorithms.gkd import GKD
from relax.algorithms.grpo import CISPO, GRPO, GSPO, SAPO
from relax.algorithms.m2po import M2PO
from relax.algorithms.ppo import PPO
from relax.algorithms.reinforce import ReinforcePlusPlus, ReinforcePlusPlusBaseline
from relax.algorithms.rloo import RLOO
from relax.importing import load_attribute

BUILTIN_ALGORITHMS: tuple[type[RLAlgorithm], ...] = (
    GRPO,
    GSPO,
    SAPO,
    CISPO,
    RLOO,
    ReinforcePlusPlus,
    ReinforcePlusPlusBaseline,
    PPO,
    M2PO,
    GDPO,
    OnPolicyDistill,
    GKD,
)

_BY_NAME: dict[str, type[RLAlgorithm]] = {cls.name: cls for cls in BUILTIN_ALGORITHMS}
if len(_BY_NAME) != len(BUILTIN_ALGORITHMS):  # pragma: no cover - guards edits to the tuple above
    raise RuntimeError("two built-in algorithms share a name")


def algorithm_names() -> tuple[str, ...]:
    """Registered names in definition order (feeds argparse ``choices``)."""
    return tuple(_BY_NAME)


def get_algorithm(name: str) -> type[RLAlgorithm]:
    """The built-in class registered as ``name``."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(
            f"Unknown advantage estimator {name!r}. Available: {', '.join(_BY_NAME)} "
            "(or a dotted path 'package.module:ClassName' to your own RLAlgorithm subclass)."
        ) from None


def is_dotted_path(spec: str) -> bool:
    return ":" in spec


def load_algorithm(spec: str) -> type[RLAlgorithm]:
    """Resolve a registered name or a ``package.module:ClassName`` path to an ``RLAlgorithm`` class."""
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"An algorithm spec must be a non-empty string, got {spec!r}")
    if not is_dotted_path(spec):
        return get_algorithm(spec)
    # No flag in the messages: the command line prefixes "argument --advantage-estimator:" itself.
    cls = load_attribute(spec, expected="'package.module:ClassName', e.g. 'my_pkg.my_algo:MyAlgo'")
    if not (isinstance(cls, type) and issubclass(cls, RLAlgorithm)):
        raise TypeError(f"{spec!r} is {cls!r}, which is not a subclass of relax.algorithms.RLAlgorithm.")
    if getattr(cls, "__abstractmethods__", None):
        missing = ", ".join(sorted(cls.__abstractmethods__))
        raise TypeError(f"{spec!r} is abstract: it does not implement {missing}.")
    return cls
