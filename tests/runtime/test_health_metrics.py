"""The always-on policy health metrics of the actor (``actor/policy_entropy``, ``actor/kl_to_ref``):
logged on every step whatever the loss uses, and equal to an independent computation from the
model's own logits."""

from __future__ import annotations

import math

import pytest
import torch
from memory_plane import MemoryDataPlane

from relax.algorithms import AlgorithmConfig
from relax.config.run import RunConfig
from relax.models.tiny.model import TinyCausalLM
from relax.models.tiny.weights import load_warmup_model
from relax.runtime.metrics.actor_metrics import policy_health_shares
from relax.runtime.step.actor_worker import ActorCore
from relax.runtime.step.fields import BATCH_FIELDS, token_batch
from relax.runtime.step.rollout_worker import RolloutCore
from relax.runtime.step.schedule import plan_step, segment_slices

KEYS = ("correct", "digits", "format", "length")


def test_shares_by_hand():
    # two samples, three response tokens, the last token of the second sample is padding
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    shard = {
        "old_entropy": torch.tensor([[1.0, 2.0, 3.0], [0.5, 0.5, 0.0]]),
        "old_log_probs": torch.tensor([[-1.0, -2.0, -0.5], [-0.1, -3.0, 0.0]]),
        "ref_log_probs": torch.tensor([[-1.5, -1.0, -0.5], [-0.2, -1.0, 0.0]]),
    }
    # this rank holds 5 of the mini-batch's 10 tokens: the shares are sums over 10
    out = policy_health_shares(shard, slice(0, 2), mask, 10.0, "k1")
    assert out["policy_entropy"] == pytest.approx((1 + 2 + 3 + 0.5 + 0.5) / 10)
    assert out["kl_to_ref"] == pytest.approx((0.5 - 1.0 + 0.0 + 0.1 - 2.0) / 10)
    k3 = sum(math.exp(-d) - 1 + d for d in (0.5, -1.0, 0.0, 0.1, -2.0))
    assert policy_health_shares(shard, slice(0, 2), mask, 10.0, "k3")["kl_to_ref"] == pytest.approx(k3 / 10)
    del shard["ref_log_probs"]  # no reference model: no KL metric
    assert set(policy_health_shares(shard, slice(1, 2), mask[1:], 10.0, "k1")) == {"policy_entropy"}


def _config(**kw) -> RunConfig:
    return RunConfig(advantage_estimator="grpo", algorithm=AlgorithmConfig(reward_keys=KEYS, n_samples_per_prompt=4,
                     **kw), rollout_batch_size=6, num_steps_per_rollout=2, seed=7)


def _reference_means(model: TinyCausalLM, batch, plan, ref: TinyCausalLM | None):
    """Per mini-batch token means of the entropy (and k1 KL to ``ref``), averaged over mini-batches,
    from the model's logits with torch.distributions (independent of relax's log-prob code)."""
    entropies, kls = [], []
    with torch.no_grad():
        for rows in segment_slices(plan.rank_segment_sizes(0)):
            sub = batch.select(rows)
            p, t = sub.prompt_width, sub.response_ids.shape[1]
            mask = sub.response_mask.float()

            def dist(m):
                logits = m(sub.input_ids, sub.attention_mask, sub.position_ids)[:, p - 1: p + t - 1]
                return torch.distributions.Categorical(logits=logits.double())

            d = dist(model)
            entropies.append(float((d.entropy() * mask).sum() / mask.sum()))
            if ref is not None:
                k1 = d.log_prob(sub.response_ids) - dist(ref).log_prob(sub.response_ids)
                kls.append(float((k1 * mask).sum() / mask.sum()))
    return sum(entropies) / len(entropies), (sum(kls) / len(kls) if kls else None)


def test_actor_logs_entropy_and_kl_to_the_reference_of_the_policy_before_the_update():
    # entropy_coef 0 and no KL term: the metrics are still logged (always on)
    cfg = _config()
    plane = MemoryDataPlane()
    rollout = RolloutCore(cfg, "grpo", plane)
    actor = ActorCore(cfg, "grpo", with_reference=True, advantages_on_actor=True, data_plane=plane)
    policy = load_warmup_model()
    weights = None
    for step in (1, 2):
        out = rollout.step(step)
        plan = plan_step(out["kept_uids"], out["group_tokens"], 4, 2, 1)
        assert plan.num_groups >= 2, "the fixed seed should keep at least two groups"
        batch = token_batch(plane.read(step, BATCH_FIELDS, "check", plan.num_groups, plan.rank_uids(0)).fields)
        if weights is not None:
            policy.load_state_dict(weights)
        entropy, kl = _reference_means(policy, batch, plan, load_warmup_model())
        metrics, weights = actor.train(step, plan)
        assert metrics["actor/policy_entropy"] == pytest.approx(entropy, rel=1e-5)
        assert metrics["actor/kl_to_ref"] == pytest.approx(kl, rel=1e-4, abs=1e-7)
        if step == 1:
            assert kl == 0.0  # the policy starts as the reference
    assert abs(metrics["actor/kl_to_ref"]) > 1e-6  # one update later the policy has moved
