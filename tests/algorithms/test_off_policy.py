"""Off-policy correction of the GRPO-family loss (``--off-policy-correction``), hand-computed."""

import math

import pytest
import torch

from relax.algorithms import AlgorithmConfig, PolicyLossInputs, get_algorithm
from relax.algorithms import numerics

PROXIMAL = torch.tensor([[0.0, -1.0, -0.2]])
BEHAVIOUR = torch.tensor([[-0.5, 0.0, -0.2]])  # w = exp(0.5) = 1.6487, exp(-1) = 0.3679, 1


def test_behaviour_weights_truncate_or_drop_above_the_cap():
    w, capped = numerics.behaviour_weights(PROXIMAL, BEHAVIOUR, "tis", 1.5)
    torch.testing.assert_close(w, torch.tensor([[1.5, math.exp(-1.0), 1.0]]))
    assert capped.tolist() == [[True, False, False]]
    w, capped = numerics.behaviour_weights(PROXIMAL, BEHAVIOUR, "decoupled", 1.5)
    torch.testing.assert_close(w, torch.tensor([[0.0, math.exp(-1.0), 1.0]]))
    assert capped.tolist() == [[True, False, False]]
    with pytest.raises(ValueError, match="mode must be one of"):
        numerics.behaviour_weights(PROXIMAL, BEHAVIOUR, "none", 1.5)


def _loss(correction: str, rollout_log_probs=BEHAVIOUR):
    config = AlgorithmConfig(off_policy_correction=correction, off_policy_cap=1.5)
    algorithm = get_algorithm("grpo")(config)
    log_probs = PROXIMAL.clone().requires_grad_(True)  # ratio 1: the PPO clip is inactive
    out = algorithm.policy_loss(PolicyLossInputs(
        log_probs=log_probs, old_log_probs=PROXIMAL, advantages=torch.tensor([[1.0, -2.0, 0.5]]),
        response_mask=torch.ones(1, 3, dtype=torch.bool), rollout_log_probs=rollout_log_probs,
    ))
    return out


@pytest.mark.parametrize("correction, weights", [
    ("none", (1.0, 1.0, 1.0)),
    ("tis", (1.5, math.exp(-1.0), 1.0)),
    ("decoupled", (0.0, math.exp(-1.0), 1.0)),
])
def test_the_per_token_loss_is_weighted(correction, weights):
    # per-token loss at ratio 1 is -A = (-1, 2, -0.5); token_mean over 3 tokens
    expected = (-1.0 * weights[0] + 2.0 * weights[1] - 0.5 * weights[2]) / 3
    out = _loss(correction)
    assert float(out.loss) == pytest.approx(expected, rel=1e-6)
    if correction != "none":
        assert float(out.metrics["off_policy_weight"]) == pytest.approx(sum(weights) / 3, rel=1e-6)
        assert float(out.metrics["off_policy_capped_frac"]) == pytest.approx(1 / 3)


def test_a_correction_without_behaviour_log_probs_is_an_error():
    with pytest.raises(ValueError, match="needs PolicyLossInputs.rollout_log_probs"):
        _loss("tis", rollout_log_probs=None)
