"""Role derivation: one pure function of the algorithm's capabilities and the configuration."""

from __future__ import annotations

import pytest
import torch

from relax.algorithms import BUILTIN_ALGORITHMS, AlgorithmConfig
from relax.algorithms.grpo import GRPO
from relax.config.run import RunConfig
from relax.runtime.checks import roles as R

KEYS = ("correct", "format")


def _config(**algo) -> RunConfig:
    return RunConfig(algorithm=AlgorithmConfig(reward_keys=KEYS, **algo))


@pytest.mark.parametrize("cls", BUILTIN_ALGORITHMS, ids=lambda c: c.name)
def test_every_builtin_gets_rollout_advantages_actor_and_no_reference_by_default(cls):
    layout = R.derive_roles(cls, _config())
    assert {R.ROLLOUT, R.ADVANTAGES, R.ACTOR} <= set(layout.roles)
    assert R.REFERENCE not in layout
    assert (R.CRITIC in layout) == cls.needs_critic
    assert layout.placement[R.ADVANTAGES] == R.SERVE
    assert list(layout.roles) == [r for r in R.ROLE_ORDER if r in layout.roles]


def test_only_ppo_among_builtins_has_a_critic():
    with_critic = [cls.name for cls in BUILTIN_ALGORITHMS if R.CRITIC in R.derive_roles(cls, _config())]
    assert with_critic == ["ppo"]
    ppo = R.derive_roles(next(c for c in BUILTIN_ALGORITHMS if c.name == "ppo"), _config())
    assert ppo.roles == (R.ROLLOUT, R.CRITIC, R.ADVANTAGES, R.ACTOR)


@pytest.mark.parametrize(
    "algo, expected",
    [
        ({"kl_coef": 0.05}, True),
        ({"use_kl_loss": True, "kl_loss_coef": 0.01}, True),
        ({"use_kl_loss": True, "kl_loss_coef": 0.0}, False),  # a zero-weight KL term needs no reference
        ({"kl_loss_coef": 0.01}, False),  # coefficient without --use-kl-loss: no KL term
    ],
)
def test_reference_exists_only_when_a_kl_term_is_on(algo, expected):
    layout = R.derive_roles(GRPO, _config(**algo))
    assert (R.REFERENCE in layout) is expected
    if expected:
        assert layout.placement[R.REFERENCE] == R.ON_ACTOR


def test_advantages_on_actor_moves_the_advantages_role():
    cfg = RunConfig(algorithm=AlgorithmConfig(reward_keys=KEYS), advantages_on_actor=True)
    layout = R.derive_roles(GRPO, cfg)
    assert layout.placement[R.ADVANTAGES] == R.ON_ACTOR
    assert R.ADVANTAGES in layout


def test_a_user_class_gets_its_roles_from_capabilities_not_its_name():
    class MyValueMethod(GRPO):
        name = "grpo_lookalike_with_critic"
        needs_critic = True
        group_relative = False

        def compute_advantages(self, inputs, process_group=None):
            z = torch.zeros_like(inputs.response_mask, dtype=torch.float32)
            return z, z

    assert R.CRITIC in R.derive_roles(MyValueMethod, _config())
    assert R.CRITIC not in R.derive_roles(GRPO, _config())
