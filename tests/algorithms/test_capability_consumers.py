"""``kl_level`` is consumed (GRPO's ``log_ratio`` follows it, so any GRPO-family class gets the
sequence-level ratio by declaring it), and ``needs_full_log_probs`` is gone with a reason."""

from __future__ import annotations

import pytest
import torch

from relax.algorithms import AlgorithmConfig, PolicyLossInputs, get_algorithm
from relax.algorithms.grpo import CISPO, GRPO


def _inputs():
    log_probs = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, -1.1]])
    old = torch.tensor([[-1.2, -1.5, -0.5], [-0.3, -0.9, -1.0]])
    mask = torch.tensor([[True, True, False], [True, True, True]])
    adv = torch.tensor([[1.0, 1.0, 0.0], [-0.5, -0.5, -0.5]])
    return PolicyLossInputs(log_probs=log_probs, old_log_probs=old, advantages=adv, response_mask=mask)


def test_kl_level_sequence_gives_the_mean_log_ratio_of_each_response():
    algo = get_algorithm("gspo")(AlgorithmConfig())
    x = _inputs()
    ratio = algo.log_ratio(x.log_probs, x.old_log_probs, x.response_mask)
    # row 0: (0.2 + -0.5) / 2 = -0.15 on every token; row 1: (0 + 0.2 - 0.1) / 3
    assert ratio[0].tolist() == pytest.approx([-0.15] * 3)
    assert ratio[1].tolist() == pytest.approx([0.1 / 3] * 3)
    token = GRPO(AlgorithmConfig()).log_ratio(x.log_probs, x.old_log_probs, x.response_mask)
    assert torch.equal(token, x.log_probs - x.old_log_probs)


def test_a_user_class_gets_the_sequence_ratio_from_the_capability_alone():
    class SequenceCISPO(CISPO):
        name = None
        kl_level = "sequence"

    x = _inputs()
    mine = SequenceCISPO(AlgorithmConfig()).policy_loss(x)
    token = CISPO(AlgorithmConfig()).policy_loss(x)
    # CISPO weighs each token by its clipped ratio: exp(seq mean) instead of exp(per-token) changes the loss
    x = _inputs()
    seq = torch.tensor([[-0.15] * 3, [0.1 / 3] * 3])
    weight = torch.exp(seq).clamp(0.8, 1.2)  # CISPO: sg(clip(r, 1 - eps, 1 + eps_high)) on every token
    per_token = -weight * x.advantages * x.log_probs
    by_hand = per_token[x.response_mask].sum() / x.response_mask.sum()
    assert float(mine.loss) == pytest.approx(float(by_hand), rel=1e-6)
    assert float(mine.loss) != pytest.approx(float(token.loss), rel=1e-6)


def test_needs_full_log_probs_is_refused_with_the_reason():
    with pytest.raises(TypeError, match=r"Old\.needs_full_log_probs is not a relax capability: relax never splits"):
        class Old(GRPO):
            needs_full_log_probs = True
