"""``RLAlgorithm``: one RL method is one class.

A method subclasses ``RLAlgorithm`` and overrides only the stages that differ from its parent:

- ``normalize_rewards(rewards, group_ids)`` -> one float32 scalar per sample (rollout worker);
- ``compute_advantages(inputs, process_group=None)`` -> ``(advantages, returns)`` ``[N, T]``
  (advantages deployment, or each training rank with its data-parallel group);
- ``policy_loss(inputs)`` -> ``PolicyLossOutput`` (each training rank).

Two more methods have defaults a subclass may override: ``group_has_signal`` (which prompt groups the
rollout keeps) and ``reward_diagnostics`` (the per-step metrics of the raw rewards; a method adds
the statistics of its own reward stage there, so that the runtime never inspects a specific
algorithm).

A method's own hyper-parameters are fields of its own ``Config``: an attrs class deriving from its
parent's ``Config`` (``RLAlgorithm.Config`` is ``AlgorithmConfig``, the fields every method shares),
each field declaring its flag with ``metadata=flag(...)``. ``relax train`` builds its parser from
the chosen class's ``Config``, and every process instantiates the class with an instance of it.

Capability attributes (see ``capabilities.CAPABILITIES``) are validated by the metaclass when the
class is *defined*, so a typo or a contradiction fails at import time with a ``TypeError`` naming the
class and the attribute, instead of silently doing something else at run time.
"""

from __future__ import annotations

import abc
import difflib
import inspect
from typing import ClassVar

import attrs
import torch

from relax.algorithms import diagnostics
from relax.algorithms.capabilities import (
    CAPABILITIES,
    CONTRADICTIONS,
    METADATA_ATTRIBUTES,
    REMOVED_CAPABILITIES,
)
from relax.algorithms.types import AdvantageInputs, PolicyLossInputs, PolicyLossOutput
from relax.config.algorithm import AlgorithmConfig


def _is_plain_data(value) -> bool:
    """True for class attributes that look like settings (not methods, properties or descriptors)."""
    if inspect.isfunction(value) or inspect.isclass(value):
        return False
    if isinstance(value, (staticmethod, classmethod, property)) or hasattr(value, "__get__"):
        return False
    return not callable(value)


class AlgorithmMeta(abc.ABCMeta):
    """Validates capability attributes at class definition and records concrete subclasses."""

    # Every concrete subclass ever defined, for diagnostics and registry-consistency tests.
    # Name lookup never uses this (see relax.algorithms.registry).
    defined: ClassVar[list[type]] = []

    def __new__(mcs, name, bases, namespace, **kwargs):
        cls = super().__new__(mcs, name, bases, namespace, **kwargs)
        if namespace.get("__module__") == __name__ and name == "RLAlgorithm":
            return cls
        mcs._check_namespace(cls, namespace)
        mcs._check_values(cls)
        if not inspect.isabstract(cls):
            AlgorithmMeta.defined.append(cls)
        return cls

    @staticmethod
    def _check_namespace(cls, namespace) -> None:
        known = set(CAPABILITIES) | set(METADATA_ATTRIBUTES)
        for attr, value in namespace.items():
            if attr.startswith("_") or attr.isupper() or attr in known or not _is_plain_data(value):
                continue
            if attr in REMOVED_CAPABILITIES:
                raise TypeError(f"{cls.__qualname__}.{attr} is not a relax capability: {REMOVED_CAPABILITIES[attr]}")
            close = difflib.get_close_matches(attr, sorted(known), n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise TypeError(
                f"{cls.__qualname__}.{attr} is not a known capability attribute.{hint} Known "
                f"capabilities: {', '.join(sorted(CAPABILITIES))}. Use an UPPER_CASE or _private name "
                "for a class constant."
            )

    @staticmethod
    def _check_added_fields(owner: str, added) -> None:
        """A field a method's ``Config`` adds becomes a ``relax train`` flag of its own: it needs a
        default (the method must run without the flag) and a name no shared flag has (``lr`` would
        be two ``--lr`` flags)."""
        from relax.config.run import RunConfig

        shared = attrs.fields_dict(RunConfig)
        for field in added:
            flag = "--" + field.name.replace("_", "-")
            if field.name in shared:
                raise TypeError(
                    f"{owner}.Config.{field.name} has the name of relax train's shared flag {flag} "
                    f"(RunConfig.{field.name}); give the method's field another name, e.g. {field.name}_{owner.lower()}"
                )
            if field.default is attrs.NOTHING:
                raise TypeError(
                    f"{owner}.Config.{field.name} has no default; every field a method adds is an optional flag "
                    f"({flag}): give it one, e.g. {field.name}: float = attrs.field(default=..., metadata=flag(...))"
                )

    @staticmethod
    def _check_values(cls) -> None:
        owner = cls.__qualname__
        for cap in CAPABILITIES.values():
            cap.check(owner, getattr(cls, cap.name))
        for a, va, b, vb, why in CONTRADICTIONS:
            value_a, value_b = getattr(cls, a), getattr(cls, b)
            hit_b = value_b <= vb if b == "min_group_size" else value_b == vb
            if value_a == va and hit_b:
                raise TypeError(f"{owner}.{a}={value_a!r} contradicts {owner}.{b}={value_b!r}: {why}")
        name = cls.__dict__.get("name", None)
        if name is not None and (not isinstance(name, str) or not name):
            raise TypeError(f"{owner}.name must be a non-empty string, got {name!r}")
        config_cls = cls.__dict__.get("Config")
        if config_cls is not None:
            parent = next(b.Config for b in cls.__mro__[1:] if "Config" in b.__dict__)
            if not (isinstance(config_cls, type) and attrs.has(config_cls) and issubclass(config_cls, parent)):
                raise TypeError(
                    f"{owner}.Config must be an attrs class deriving from {parent.__qualname__} (the parent "
                    "method's Config), e.g. @attrs.frozen(kw_only=True) class Config(Parent.Config): ..."
                )
            inherited = attrs.fields_dict(parent)
            AlgorithmMeta._check_added_fields(owner, [f for f in attrs.fields(config_cls) if f.name not in inherited])
            # The fields a method adds are read by it: they join the hyper-parameters it lists (when it
            # lists any), so `relax algorithms` shows them and validation never calls them unread.
            listed = cls.hyperparameters
            if isinstance(listed, tuple) and listed:
                added = tuple(f.name for f in attrs.fields(config_cls) if f.name not in inherited and f.name not in listed)
                cls.hyperparameters = listed + added
        hyper = cls.hyperparameters
        fields = attrs.fields_dict(cls.Config)
        if not isinstance(hyper, tuple) or any(h not in fields for h in hyper):
            unknown = [h for h in hyper if h not in fields] if isinstance(hyper, tuple) else hyper
            raise TypeError(
                f"{owner}.hyperparameters must be a tuple of {owner}.Config field names; unknown: {unknown!r}"
            )


class RLAlgorithm(metaclass=AlgorithmMeta):
    """Base class of every RL method. Instantiate with an instance of its ``Config``.

    Subclasses override ``normalize_rewards``, ``compute_advantages`` and ``policy_loss`` (all three
    are abstract here) and may override ``group_has_signal`` (which prompt groups the rollout keeps)
    and ``reward_diagnostics`` (extending, not replacing, the base metrics).
    """

    # -- capability attributes (defaults; documented in capabilities.py) --
    needs_critic: ClassVar[bool] = False
    uses_reward_components: ClassVar[bool] = False
    min_group_size: ClassVar[int] = 1
    supports_async: ClassVar[bool] = True
    advantage_normalization: ClassVar[str] = "optional"
    requires_rewards_normalization: ClassVar[bool] = False
    allows_reward_post_process_hooks: ClassVar[bool] = True
    forbids_reward_side_kl: ClassVar[bool] = False
    requires_global_token_loss: ClassVar[bool] = False
    requires_on_policy_updates: ClassVar[bool] = False
    kl_level: ClassVar[str] = "token"
    group_relative: ClassVar[bool] = False
    needs_teacher: ClassVar[bool] = False

    # -- the method's hyper-parameters: a subclass adds its own in a Config deriving from its parent's --
    Config: ClassVar[type[AlgorithmConfig]] = AlgorithmConfig

    # -- metadata --
    name: ClassVar[str | None] = None
    hyperparameters: ClassVar[tuple[str, ...]] = ()
    paper: ClassVar[str | None] = None

    def __init__(self, config: AlgorithmConfig | None = None):
        self.config = type(self).config_of(config)

    @classmethod
    def config_of(cls, config: AlgorithmConfig | None = None) -> AlgorithmConfig:
        """``config`` as an instance of ``cls.Config``.

        A configuration of a parent's ``Config`` (e.g. a plain ``AlgorithmConfig`` built in Python)
        is rebuilt as ``cls.Config`` with its values and the defaults of the method's own fields;
        one holding a field ``cls.Config`` lacks is refused, so a value is never dropped.
        """
        if config is None:
            return cls.Config()
        if isinstance(config, cls.Config):
            return config
        if not isinstance(config, AlgorithmConfig):
            raise TypeError(
                f"{cls.__name__} expects a {cls.__name__}.Config (an AlgorithmConfig), got {type(config).__name__}"
            )
        own = attrs.fields_dict(cls.Config)
        foreign = [f.name for f in attrs.fields(type(config)) if f.name not in own]
        if foreign:
            raise TypeError(
                f"{cls.__name__} expects a {cls.__name__}.Config; the given {type(config).__qualname__} holds "
                f"{', '.join(foreign)}, which {cls.__name__} does not have"
            )
        return cls.Config(**{f.name: getattr(config, f.name) for f in attrs.fields(type(config))})

    @classmethod
    def capabilities(cls) -> dict[str, object]:
        """The effective value of every capability attribute (inherited ones included)."""
        return {name: getattr(cls, name) for name in CAPABILITIES}

    @abc.abstractmethod
    def normalize_rewards(self, rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        """``rewards`` ``[N]`` or ``[N, K]`` (columns in ``reward_keys`` order) -> float32 ``[N]``."""

    @abc.abstractmethod
    def compute_advantages(
        self, inputs: AdvantageInputs, process_group=None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """-> ``(advantages [N, T], returns [N, T])``, zero where ``response_mask`` is false."""

    @abc.abstractmethod
    def policy_loss(self, inputs: PolicyLossInputs) -> PolicyLossOutput:
        """-> a differentiable scalar loss and detached scalar metrics."""

    def group_has_signal(self, rewards: torch.Tensor, group_ids: torch.Tensor) -> torch.Tensor:
        """Per sample: does its prompt group carry a learning signal *for this algorithm*?

        The rollout drops groups where this is false. The default keeps everything (an algorithm
        without a group baseline learns from a constant group too); group-relative methods override.
        """
        return torch.ones(rewards.shape[0], dtype=torch.bool, device=rewards.device)

    def reward_diagnostics(
        self,
        rewards: torch.Tensor,
        group_ids: torch.Tensor,
        advantages: torch.Tensor | None = None,
        *,
        response_mask: torch.Tensor | None = None,
    ) -> dict[str, float]:
        """Metrics of one step's raw rewards, ``{name: float}``, logged to ``metrics.jsonl``.

        ``rewards`` is the whole rollout's raw ``[N]`` / ``[N, K]`` matrix (columns in
        ``config.reward_keys`` order) *before* the group filter; ``advantages`` the final per-sample
        advantages (``[N]``, or ``[N, T]`` with ``response_mask``) with 0 for dropped samples, or
        None when they are not known yet. The default returns the statistics that do not depend on
        the method (``diagnostics.reward_statistics``: ``reward/<key>/*``, ``multi_reward/*``,
        ``advantage/*``). An override calls ``super()`` and adds keys under its own prefix (GDPO:
        ``gdpo/<key>/adv_share``).
        """
        c = self.config
        return diagnostics.reward_statistics(
            rewards, group_ids, c.reward_keys, c.reward_weights, advantages, response_mask=response_mask
        )

    def teacher_top_k(self) -> int | None:
        """How much of the teacher's distribution the loss reads (a method with a teacher): None (the
        default) = only the sampled tokens' log-probs; an int k = at every position also the log-probs
        of the teacher's k most likely tokens under the teacher and the student
        (``PolicyLossInputs.teacher_top_log_probs`` / ``student_top_log_probs``), 0 = the whole
        vocabulary. The training ranks keep ``[N, T, k]`` per shard and hand the loss the student's whole
        distribution of one micro-batch at a time."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"
