"""The explicit registry, dotted-path loading, and the import boundary of relax.algorithms."""

import importlib
import inspect
import json
import pkgutil
import subprocess
import sys
import textwrap
import uuid

import pytest
import torch

import relax.algorithms
from relax.algorithms import (
    BUILTIN_ALGORITHMS,
    AlgorithmConfig,
    AdvantageInputs,
    RLAlgorithm,
    algorithm_names,
    get_algorithm,
    load_algorithm,
)
from relax.algorithms.base import AlgorithmMeta

EXPECTED_NAMES = {
    "grpo", "gspo", "sapo", "cispo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline",
    "ppo", "m2po", "gdpo", "on-policy-distill", "gkd",
}


def test_names_are_unique_and_match_the_class_attribute():
    names = algorithm_names()
    assert len(names) == len(set(names)) == len(BUILTIN_ALGORITHMS)
    assert set(names) == EXPECTED_NAMES
    assert names == tuple(cls.name for cls in BUILTIN_ALGORITHMS)  # definition order
    for name in names:
        cls = get_algorithm(name)
        assert cls.name == name
        assert load_algorithm(name) is cls


def test_builtins_are_concrete_rl_algorithms():
    for cls in BUILTIN_ALGORITHMS:
        assert issubclass(cls, RLAlgorithm)
        assert not inspect.isabstract(cls), cls
        assert cls.__module__.startswith("relax.algorithms."), cls


def test_every_concrete_builtin_subclass_is_registered():
    # Import every module of the package so that a class defined in a module the registry does
    # not import is also recorded by the metaclass.
    for info in pkgutil.walk_packages(relax.algorithms.__path__, "relax.algorithms."):
        importlib.import_module(info.name)
    builtin_defined = [
        cls for cls in AlgorithmMeta.defined
        if cls.__module__.startswith("relax.algorithms.") and not inspect.isabstract(cls)
    ]
    assert builtin_defined, "the metaclass recorded no built-in class"
    # GDPO's presets are reached through --gdpo-preset (GDPO.PRESETS), not registered names of their own
    registered = set(BUILTIN_ALGORITHMS) | {p for c in BUILTIN_ALGORITHMS for p in getattr(c, "PRESETS", {}).values()}
    missing = [f"{c.__module__}:{c.__qualname__}" for c in builtin_defined if c not in registered]
    assert not missing, f"concrete built-in classes missing from BUILTIN_ALGORITHMS: {missing}"


def test_capabilities_stated_by_the_specification():
    caps = {name: get_algorithm(name).capabilities() for name in algorithm_names()}
    gdpo = caps["gdpo"]
    assert gdpo["uses_reward_components"] is True
    assert gdpo["min_group_size"] == 2
    assert gdpo["advantage_normalization"] == "forbidden"
    assert [n for n, c in caps.items() if c["needs_critic"]] == ["ppo"]
    assert [n for n, c in caps.items() if c["kl_level"] == "sequence"] == ["gspo"]
    assert caps["rloo"]["min_group_size"] == 2
    assert caps["reinforce_plus_plus_baseline"]["min_group_size"] == 2
    for name in ("grpo", "gspo", "sapo", "cispo", "rloo", "gdpo", "reinforce_plus_plus_baseline"):
        assert caps[name]["group_relative"] is True, name
    for name in ("ppo", "reinforce_plus_plus"):
        assert caps[name]["group_relative"] is False, name


def test_hyperparameters_name_config_fields():
    for cls in BUILTIN_ALGORITHMS:
        assert isinstance(cls.hyperparameters, tuple)
    assert "grpo_std_normalization" in get_algorithm("grpo").hyperparameters
    assert "reward_weights" in get_algorithm("gdpo").hyperparameters
    assert {"gamma", "lam"} <= set(get_algorithm("ppo").hyperparameters)


def test_unknown_name_lists_the_valid_names():
    with pytest.raises(KeyError) as info:
        get_algorithm("grpoo")
    msg = str(info.value)
    assert "grpoo" in msg
    for name in EXPECTED_NAMES:
        assert name in msg
    with pytest.raises(KeyError, match="Available"):
        load_algorithm("not_an_algorithm")


# -- dotted-path loading of a user's own class, from a directory outside the repository --

USER_MODULE = """
import torch
from relax.algorithms import RLAlgorithm, PolicyLossOutput
from relax.algorithms.grpo import GRPO


class CenteredOnly(RLAlgorithm):
    name = "centered_only"
    min_group_size = 2

    def normalize_rewards(self, rewards, group_ids):
        return (rewards - rewards.mean()).float()

    def compute_advantages(self, inputs, process_group=None):
        adv = inputs.rewards[:, None] * inputs.response_mask
        return adv, adv

    def policy_loss(self, inputs):
        return PolicyLossOutput(loss=-(inputs.advantages * inputs.log_probs * inputs.response_mask).sum())


class MyGRPO(GRPO):
    name = "my_grpo"


class Unfinished(RLAlgorithm):
    def normalize_rewards(self, rewards, group_ids):
        return rewards


class NotAnAlgorithm:
    pass


not_a_class = 3
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    module_name = f"user_algos_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module_name}.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield module_name
    sys.modules.pop(module_name, None)


def test_load_user_subclass_from_outside_the_repo(user_module):
    cls = load_algorithm(f"{user_module}:CenteredOnly")
    assert cls.__name__ == "CenteredOnly" and issubclass(cls, RLAlgorithm)
    assert cls.min_group_size == 2
    algo = cls(AlgorithmConfig())
    out = algo.normalize_rewards(torch.tensor([1.0, 3.0]), torch.tensor([0, 0]))
    assert out.tolist() == [-1.0, 1.0]
    adv, _ = algo.compute_advantages(
        AdvantageInputs(rewards=out, response_mask=torch.tensor([[True, False], [True, True]]))
    )
    assert adv.tolist() == [[-1.0, 0.0], [1.0, 1.0]]
    # a user subclass of a built-in inherits its stages
    sub = load_algorithm(f"{user_module}:MyGRPO")
    assert issubclass(sub, get_algorithm("grpo"))
    # the user's class never enters the built-in registry
    assert "centered_only" not in algorithm_names()


@pytest.mark.parametrize("spec", ["a:b:c", ":Cls", "mod:"])
def test_malformed_path(spec):
    with pytest.raises(ValueError, match=r"Malformed path .*expected 'package\.module:ClassName'"):
        load_algorithm(spec)


def test_empty_spec():
    with pytest.raises(ValueError, match="non-empty string"):
        load_algorithm("")


def test_missing_module():
    with pytest.raises(ValueError, match=r"Cannot import module 'no_such_pkg_relax\.algo'.*PYTHONPATH"):
        load_algorithm("no_such_pkg_relax.algo:Thing")


def test_missing_class_lists_what_the_module_defines(user_module):
    with pytest.raises(ValueError) as info:
        load_algorithm(f"{user_module}:CenteredOnlyy")
    msg = str(info.value)
    assert "'CenteredOnlyy'" in msg and "CenteredOnly" in msg.replace("'CenteredOnlyy'", "")


@pytest.mark.parametrize("attr", ["NotAnAlgorithm", "not_a_class"])
def test_not_an_rl_algorithm(user_module, attr):
    with pytest.raises(TypeError, match="not a subclass of relax.algorithms.RLAlgorithm"):
        load_algorithm(f"{user_module}:{attr}")


def test_abstract_class_names_the_missing_methods(user_module):
    with pytest.raises(TypeError, match=r"abstract.*compute_advantages, policy_loss"):
        load_algorithm(f"{user_module}:Unfinished")


# -- the import boundary --

FORBIDDEN_TOP_LEVEL = ("ray", "megatron", "transfer_queue", "tensordict")
HIGHER_RELAX_LAYERS = ("relax.runtime", "relax.backends", "relax.rollout", "relax.cli")


def test_import_loads_no_heavy_or_higher_layer_modules():
    code = textwrap.dedent(
        """
        import json, sys
        import relax.algorithms
        from relax.algorithms import get_algorithm
        get_algorithm("gdpo")
        print(json.dumps(sorted(sys.modules)))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    heavy = [m for m in loaded if m.split(".")[0] in FORBIDDEN_TOP_LEVEL]
    higher = [m for m in loaded if m.startswith(HIGHER_RELAX_LAYERS)]
    assert not heavy, f"import relax.algorithms loaded {heavy}"
    assert not higher, f"import relax.algorithms loaded higher relax layers {higher}"
    assert "relax.algorithms.gdpo" in loaded  # the probe did import the package
