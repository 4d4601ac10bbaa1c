"""The algorithm API checks its own inputs and a user's outputs (relax/algorithms/types.py):

- ``PolicyLossInputs`` refuses a NaN/inf advantage on a valid token and a ``global_num_tokens`` /
  ``global_num_sequences`` that is 0, negative, non-finite or not a number;
- ``normalize_rewards`` must return a finite float ``[N]`` tensor (checked where the rollout calls it);
- ``policy_loss`` must return a ``PolicyLossOutput`` whose loss is a finite float scalar (checked in
  ``relax.runtime.step.losses.policy_loss_fn``, before the backend backpropagates it).

Each message names the class, the method and the step.
"""

from __future__ import annotations

import math

import pytest
import torch

from relax.algorithms import AlgorithmConfig, PolicyLossInputs, PolicyLossOutput
from relax.algorithms.grpo import GRPO
from relax.algorithms.types import AlgorithmOutputError, check_normalized_rewards, check_policy_loss_output
from relax.runtime.step.losses import policy_loss_fn

MASK = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)


def inputs(adv=None, **kw):
    logp = torch.full((2, 3), -1.0)
    adv = torch.tensor([[1.0, 1.0, 0.0], [-1.0, -1.0, -1.0]]) if adv is None else adv
    return PolicyLossInputs(log_probs=logp, old_log_probs=logp.clone(), advantages=adv, response_mask=MASK, **kw)


# -- inputs ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_advantage_on_a_valid_token_is_refused(bad):
    adv = torch.tensor([[1.0, 1.0, 0.0], [-1.0, bad, -1.0]])
    with pytest.raises(ValueError, match=r"advantages must be finite on every valid token; 1 are not, the first at "
                                         r"sample 1, token 1"):
        inputs(adv)


def test_a_non_finite_advantage_on_padding_is_ignored():
    inputs(torch.tensor([[1.0, 1.0, float("nan")], [-1.0, -1.0, -1.0]]))


@pytest.mark.parametrize("name", ["global_num_tokens", "global_num_sequences"])
@pytest.mark.parametrize("value, error, message", [
    (0, ValueError, "must be a positive finite count"),
    (-3, ValueError, "must be a positive finite count"),
    (0.0, ValueError, "must be a positive finite count"),
    (float("nan"), ValueError, "must be a positive finite count"),
    (float("inf"), ValueError, "must be a positive finite count"),
    ("5", TypeError, "must be a number"),
    (True, TypeError, "must be a number"),
    (torch.tensor(5.0), TypeError, "must be a number"),
])
def test_bad_global_divisors_are_refused(name, value, error, message):
    with pytest.raises(error, match=f"{name} {message}"):
        inputs(**{name: value})


def test_good_global_divisors_pass():
    inputs(global_num_tokens=5, global_num_sequences=2.0)
    inputs(global_num_tokens=None)


# -- normalize_rewards ------------------------------------------------------------------------------


@pytest.fixture
def grpo():
    return GRPO(AlgorithmConfig())


@pytest.mark.parametrize("out, message", [
    (torch.zeros(3), r"GRPO.normalize_rewards at step 7 returned shape \(3,\), expected \(4,\)"),
    (torch.zeros(4, 1), r"returned shape \(4, 1\), expected \(4,\)"),
    (torch.zeros(4, dtype=torch.int64), "returned a torch.int64 tensor; it must return floats"),
    (torch.tensor([0.0, float("nan"), 1.0, 0.0]), "returned 1 non-finite value\\(s\\), the first at sample 1: nan"),
    ([0.0, 0.0, 0.0, 0.0], "returned a list; it must return a float tensor"),
])
def test_normalize_rewards_output_is_checked(grpo, out, message):
    with pytest.raises(AlgorithmOutputError, match=message):
        check_normalized_rewards(grpo, out, (4,), step=7)


def test_a_good_normalize_rewards_output_passes(grpo):
    rewards, groups = torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=torch.float64), torch.tensor([0, 0, 1, 1])
    check_normalized_rewards(grpo, grpo.normalize_rewards(rewards, groups), (4,), step=1)


# -- policy_loss -------------------------------------------------------------------------------------


class _TLP:
    def __init__(self, log_probs):
        self.log_probs = log_probs
        self.entropy = None


@pytest.fixture
def user_loss():
    """A user's method whose loss is whatever the test sets (removed from the metaclass's record after)."""
    from relax.algorithms.base import AlgorithmMeta

    class UserLoss(GRPO):
        _result = None

        def policy_loss(self, inputs):
            return self._result(inputs)

    yield UserLoss
    AlgorithmMeta.defined[:] = [c for c in AlgorithmMeta.defined if c is not UserLoss]


@pytest.mark.parametrize("result, message", [
    (lambda i: PolicyLossOutput(loss=i.log_probs.sum() * float("nan")),
     "UserLoss.policy_loss at step 3 returned a non-finite loss \\(nan\\)"),
    (lambda i: PolicyLossOutput(loss=(i.log_probs * i.advantages).sum(1)),
     r"UserLoss.policy_loss at step 3 returned a loss of shape \(2,\); it must be a scalar"),
    (lambda i: PolicyLossOutput(loss=1.0), "returned a loss of type float; it must be a tensor"),
    (lambda i: i.log_probs.sum(), "returned a Tensor; it must return PolicyLossOutput"),
    (lambda i: PolicyLossOutput(loss=torch.tensor(1)), "returned a torch.int64 loss"),
])
def test_policy_loss_output_is_checked_with_class_method_and_step(user_loss, result, message):
    algo = user_loss(AlgorithmConfig())
    algo._result = result
    loss_fn = policy_loss_fn(
        algo, old_log_probs=torch.full((2, 3), -1.0), advantages=torch.ones(2, 3), response_mask=MASK,
        global_num_tokens=5, global_num_sequences=2, step=3,
    )
    with pytest.raises(AlgorithmOutputError, match=message):
        loss_fn(_TLP(torch.full((2, 3), -1.0, requires_grad=True)), slice(0, 2))


def test_a_builtin_loss_passes_the_check():
    algo = GRPO(AlgorithmConfig())
    loss_fn = policy_loss_fn(
        algo, old_log_probs=torch.full((2, 3), -1.0), advantages=torch.ones(2, 3), response_mask=MASK,
        global_num_tokens=5, global_num_sequences=2,
    )
    out = loss_fn(_TLP(torch.full((2, 3), -1.0, requires_grad=True)), slice(0, 2))
    assert out.loss.dim() == 0 and math.isfinite(out.loss.item())


def test_without_a_step_the_message_still_names_class_and_method():
    with pytest.raises(AlgorithmOutputError, match=r"^GRPO.policy_loss returned a non-finite loss"):
        check_policy_loss_output(GRPO(AlgorithmConfig()), PolicyLossOutput(loss=torch.tensor(float("inf"))))
