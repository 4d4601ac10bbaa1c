"""Capability attributes are validated when an RLAlgorithm subclass is *defined*."""

import pytest
import torch

from relax.algorithms import CAPABILITIES, AlgorithmConfig, PolicyLossOutput, RLAlgorithm
from relax.algorithms.base import AlgorithmMeta
from relax.algorithms.capabilities import CONTRADICTIONS


class _Concrete(RLAlgorithm):
    """A minimal concrete algorithm the tests derive from (it is never registered)."""

    def normalize_rewards(self, rewards, group_ids):
        return rewards.float()

    def compute_advantages(self, inputs, process_group=None):
        adv = inputs.rewards[:, None] * inputs.response_mask
        return adv, adv

    def policy_loss(self, inputs):
        return PolicyLossOutput(loss=(inputs.log_probs * inputs.response_mask).sum())


def _define(_cls_name="UserAlgo", base=_Concrete, **attrs):
    """Define a subclass through the metaclass, like a ``class`` statement would."""
    return type(base)(_cls_name, (base,), {"__module__": __name__, **attrs})


def _raises_naming(match_attr, _cls_name="UserAlgo", **attrs):
    with pytest.raises(TypeError) as info:
        _define(_cls_name, **attrs)
    msg = str(info.value)
    assert _cls_name in msg, msg
    assert match_attr in msg, msg
    return msg


def test_unknown_attribute_with_did_you_mean_hint():
    msg = _raises_naming("need_critic", need_critic=True)
    assert "Did you mean 'needs_critic'" in msg


def test_unknown_attribute_without_close_match_lists_known_capabilities():
    msg = _raises_naming("frobnicate", frobnicate=3)
    assert "needs_critic" in msg  # the list of known capabilities helps the user


def test_class_statement_typo_is_rejected_at_definition():
    with pytest.raises(TypeError, match=r"Typo\.min_group_sise.*Did you mean 'min_group_size'"):

        class Typo(_Concrete):
            min_group_sise = 2


@pytest.mark.parametrize(
    "attr, value",
    [
        ("needs_critic", 1),
        ("needs_critic", "yes"),
        ("uses_reward_components", None),
        ("min_group_size", 2.0),
        ("min_group_size", True),  # bool is not an int here
        ("supports_async", 0),
        ("advantage_normalization", True),
        ("kl_level", 1),
        ("group_relative", "true"),
    ],
)
def test_wrong_type(attr, value):
    msg = _raises_naming(attr, **{attr: value})
    assert CAPABILITIES[attr].type.__name__ in msg


@pytest.mark.parametrize(
    "attr, value",
    [("advantage_normalization", "whiten"), ("advantage_normalization", "Required"), ("kl_level", "tokens")],
)
def test_value_outside_enum(attr, value):
    msg = _raises_naming(attr, **{attr: value})
    for choice in CAPABILITIES[attr].choices:
        assert repr(choice) in msg


@pytest.mark.parametrize("value", [0, -1])
def test_min_group_size_below_one(value):
    msg = _raises_naming("min_group_size", min_group_size=value)
    assert ">= 1" in msg


def _non_contradicting(attr, value):
    if isinstance(value, bool):
        return not value
    if attr == "min_group_size":
        return value + 1
    return next(c for c in CAPABILITIES[attr].choices if c != value)


@pytest.mark.parametrize("a, va, b, vb, why", CONTRADICTIONS, ids=[c[0] for c in CONTRADICTIONS])
def test_each_contradictory_pair_is_rejected(a, va, b, vb, why):
    assert len(CONTRADICTIONS) >= 2
    msg = _raises_naming(a, **{a: va, b: vb})
    assert b in msg and why in msg
    # the same class with the other attribute changed is fine
    ok = _define(**{a: va, b: _non_contradicting(b, vb)})
    assert getattr(ok, a) == va


def test_contradiction_through_inheritance_is_rejected():
    parent = _define("MultiReward", uses_reward_components=True, min_group_size=2)
    with pytest.raises(TypeError, match=r"Child\.uses_reward_components=True contradicts Child\.min_group_size=1"):
        _define("Child", base=parent, min_group_size=1)


@pytest.mark.parametrize(
    "value, match",
    [
        (("eps_clip", "no_such_flag"), "no_such_flag"),
        (["eps_clip"], "tuple"),
        ("eps_clip", "tuple"),
    ],
)
def test_bad_hyperparameters(value, match):
    msg = _raises_naming("hyperparameters", hyperparameters=value)
    assert match in msg


@pytest.mark.parametrize("value", ["", 3])
def test_bad_name(value):
    _raises_naming("name", name=value)


def test_valid_user_subclass_with_constants_methods_and_properties():
    def helper(self):
        return 1

    cls = _define(
        "Fine",
        needs_critic=True,
        min_group_size=4,
        advantage_normalization="forbidden",
        kl_level="sequence",
        name="fine",
        hyperparameters=("eps_clip", "gamma"),
        paper="arXiv:0000.00000",
        EPS=1e-6,  # UPPER_CASE constant
        _cache={},  # private attribute
        helper=helper,
        scale=property(lambda self: 2.0),
        make=staticmethod(lambda: 3),
        build=classmethod(lambda cls: cls),
    )
    algo = cls(AlgorithmConfig())
    assert algo.helper() == 1 and algo.scale == 2.0 and cls.make() == 3 and cls.build() is cls
    assert cls.EPS == 1e-6
    caps = cls.capabilities()
    assert set(caps) == set(CAPABILITIES)
    assert caps["needs_critic"] is True and caps["min_group_size"] == 4 and caps["kl_level"] == "sequence"
    assert caps["supports_async"] is True  # untouched default
    assert cls in AlgorithmMeta.defined


def test_capabilities_are_inherited_and_overridable():
    parent = _define("Parent", needs_critic=True, min_group_size=3, group_relative=True)
    child = _define("Kid", base=parent, min_group_size=5)
    assert child.capabilities()["needs_critic"] is True
    assert child.capabilities()["group_relative"] is True
    assert child.capabilities()["min_group_size"] == 5
    assert parent.capabilities()["min_group_size"] == 3
    # a child inherits validated values; its own bad value is still caught
    with pytest.raises(TypeError, match=r"Kid2\.kl_level"):
        _define("Kid2", base=parent, kl_level="seq")


def test_base_class_defaults_match_capability_table():
    for name, cap in CAPABILITIES.items():
        assert getattr(RLAlgorithm, name) == cap.default, name


def test_abstract_subclass_is_not_recorded_and_cannot_be_instantiated():
    abstract = type(RLAlgorithm)("HalfDone", (RLAlgorithm,), {"__module__": __name__, "min_group_size": 2})
    assert abstract not in AlgorithmMeta.defined
    with pytest.raises(TypeError):
        abstract(AlgorithmConfig())


def test_instance_requires_an_algorithm_config():
    assert isinstance(_Concrete().config, AlgorithmConfig)  # None -> defaults
    with pytest.raises(TypeError, match="AlgorithmConfig"):
        _Concrete({"eps_clip": 0.2})


def test_default_group_has_signal_keeps_everything():
    rewards = torch.tensor([1.0, 1.0, 2.0])
    keep = _Concrete().group_has_signal(rewards, torch.tensor([0, 0, 1]))
    assert keep.dtype == torch.bool and keep.tolist() == [True, True, True]
