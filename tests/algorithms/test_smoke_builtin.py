"""Smoke tests of the built-in algorithms against small hand-computed values (the numerics author's own).

The thorough suite lives in the other files of this directory; this one pins a few numbers per
method so that a regression in ``numerics`` shows up next to the class that uses it.
"""

from __future__ import annotations

import math
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from relax.algorithms import AdvantageInputs, AlgorithmConfig, PolicyLossInputs, get_algorithm
from relax.algorithms import numerics
from relax.algorithms.m2po import m2po_threshold


def test_grpo_interleaved_groups_hand_values():
    # group 7: rewards 1, 0, 2 (mean 1, unbiased std 1); group -3: rewards 5, 1 (mean 3, std 2*sqrt(2))
    rewards = torch.tensor([1.0, 5.0, 0.0, 1.0, 2.0])
    gid = torch.tensor([7, -3, 7, -3, 7])
    out = get_algorithm("grpo")(AlgorithmConfig()).normalize_rewards(rewards, gid)
    s = 2 * math.sqrt(2)
    expected = [0.0, 2 / (s + 1e-6), -1 / (1 + 1e-6), -2 / (s + 1e-6), 1 / (1 + 1e-6)]
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, torch.tensor(expected), rtol=0, atol=1e-6)
    dr = get_algorithm("grpo")(AlgorithmConfig(grpo_std_normalization=False)).normalize_rewards(rewards, gid)
    torch.testing.assert_close(dr, torch.tensor([0.0, 2.0, -1.0, -2.0, 1.0]))


def test_grpo_weighted_components_and_signal():
    cfg = AlgorithmConfig(reward_keys=("a", "b"), reward_weights=(1.0, 2.0))
    algo = get_algorithm("grpo")(cfg)
    r = torch.tensor([[1.0, 0.0], [0.0, 0.5], [1.0, 1.0], [3.0, 0.0]])  # sums 1, 1, 3, 3
    gid = torch.tensor([0, 0, 1, 2])
    assert algo.group_has_signal(r, gid).tolist() == [False, False, False, False]
    gid2 = torch.tensor([0, 1, 0, 1])
    assert algo.group_has_signal(r, gid2).tolist() == [True, True, True, True]
    with pytest.raises(ValueError, match=r"reward 'b' of sample 2"):
        bad = torch.tensor([[1.0, 0.0], [0.0, 0.5], [1.0, float("nan")]])
        algo.normalize_rewards(bad, torch.zeros(3, dtype=torch.long))


def test_rloo_and_baseline():
    r = torch.tensor([1.0, 0.0, 0.0, 3.0])
    gid = torch.tensor([4, 4, 4, 9])
    with pytest.raises(ValueError, match="sample 3"):
        get_algorithm("rloo")(AlgorithmConfig()).normalize_rewards(r, gid)
    gid = torch.tensor([4, 4, 4, 4])
    out = get_algorithm("rloo")(AlgorithmConfig()).normalize_rewards(r, gid)
    # leave-one-out baselines: (0+0+3)/3=1, (1+0+3)/3, same, (1+0+0)/3
    torch.testing.assert_close(out, torch.tensor([0.0, -4 / 3, -4 / 3, 3 - 1 / 3]))
    base = get_algorithm("reinforce_plus_plus_baseline")(AlgorithmConfig())
    torch.testing.assert_close(base.normalize_rewards(r, gid), torch.tensor([0.0, -1.0, -1.0, 2.0]))


def test_gdpo_hand_values_and_signal():
    cfg = AlgorithmConfig(reward_keys=("c", "f"), reward_weights=(1.0, 0.5))
    algo = get_algorithm("gdpo")(cfg)
    # group 0 (samples 0, 2): c = 1, 0 (std sqrt(1/2)); f constant -> 0. group 1 (samples 1, 3): c constant, f = 0, 1
    r = torch.tensor([[1.0, 0.5], [1.0, 0.0], [0.0, 0.5], [1.0, 1.0]])
    out = algo.normalize_rewards(r, torch.tensor([0, 1, 0, 1]))
    z = 0.5 / (math.sqrt(0.5) + 1e-4)
    torch.testing.assert_close(out, torch.tensor([z, -0.5 * z, -z, 0.5 * z]), rtol=0, atol=1e-6)
    # c and f sum to a constant in every sample, but the normalized components do not cancel with unequal weights
    r2 = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
    assert algo.group_has_signal(r2, torch.zeros(4, dtype=torch.long)).all()
    equal = get_algorithm("gdpo")(AlgorithmConfig(reward_keys=("c", "f")))
    assert not equal.group_has_signal(r2, torch.zeros(4, dtype=torch.long)).any()


def test_gdpo_whitening_segments_and_broadcast():
    algo = get_algorithm("gdpo")(AlgorithmConfig(reward_keys=("c", "f")))
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0], [1, 0, 0]], dtype=torch.bool)
    rewards = torch.tensor([1.0, 3.0, 5.0, 5.0, -2.0])
    inputs = AdvantageInputs(rewards=rewards, response_mask=mask, segment_sizes=(2, 2, 1))
    adv, ret = algo.compute_advantages(inputs)
    a = 1 / (math.sqrt(2) + 1e-4)
    expected = torch.tensor([[-a, -a, 0], [a, 0, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0]])
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-6)
    assert torch.equal(adv, ret)
    with pytest.raises(ValueError, match="non-finite"):
        algo.compute_advantages(AdvantageInputs(rewards=torch.tensor([1.0, float("inf")]), response_mask=mask[:2]))


def test_ppo_gae_terminal_reward_on_last_valid_token():
    mask = torch.tensor([[True, True, False]])
    values = torch.tensor([[0.5, 0.25, 9.0]])
    algo = get_algorithm("ppo")(AlgorithmConfig(gamma=0.5, lam=0.5))
    inputs = AdvantageInputs(rewards=torch.tensor([1.0]), response_mask=mask, values=values)
    adv, ret = algo.compute_advantages(inputs)
    # t=1: delta = 1 + 0 - 0.25 = 0.75; t=0: delta = 0 + 0.5*0.25 - 0.5 = -0.375, A0 = -0.375 + 0.25*0.75
    torch.testing.assert_close(adv, torch.tensor([[-0.1875, 0.75, 0.0]]))
    torch.testing.assert_close(ret, torch.tensor([[0.3125, 1.0, 0.0]]))
    with pytest.raises(ValueError, match="critic values"):
        algo.compute_advantages(AdvantageInputs(rewards=torch.tensor([1.0]), response_mask=mask))


def test_reinforce_pp_returns_and_normalization():
    mask = torch.tensor([[True, True, True], [True, False, False]])
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.4, float("nan"), 7.0]])
    algo = get_algorithm("reinforce_plus_plus")(AlgorithmConfig(kl_coef=0.5, gamma=1.0))
    adv, ret = algo.compute_advantages(
        AdvantageInputs(rewards=torch.tensor([1.0, 2.0]), response_mask=mask, kl=kl)
    )
    g = torch.tensor([[1 - 0.3, 1 - 0.25, 1 - 0.15], [2 - 0.2, 0, 0]], dtype=torch.float64)
    torch.testing.assert_close(ret, g.float())
    valid = g[mask]
    expected = torch.zeros_like(g)
    expected[mask] = (valid - valid.mean()) / valid.var(unbiased=False).sqrt()
    torch.testing.assert_close(adv, expected.float())


def test_policy_loss_dual_clip_and_masking():
    mask = torch.tensor([[True, True, False]])
    logp = torch.tensor([[math.log(4.0), math.log(1.1), float("nan")]], requires_grad=True)
    old = torch.zeros(1, 3)
    adv = torch.tensor([[-1.0, 1.0, 5.0]])
    out = get_algorithm("grpo")(AlgorithmConfig(eps_clip_c=3.0)).policy_loss(
        PolicyLossInputs(log_probs=logp, old_log_probs=old, advantages=adv, response_mask=mask)
    )
    # token 0: A<0, r=4: max(4, 1.2)=4, capped at 3; token 1: A>0, r=1.1 within clip: -1.1
    torch.testing.assert_close(out.loss, torch.tensor((3.0 - 1.1) / 2))
    assert out.metrics["dual_clipfrac"].item() == 0.5
    out.loss.backward()
    assert torch.isfinite(logp.grad).all() and logp.grad[0, 2] == 0
    plain = get_algorithm("grpo")(AlgorithmConfig()).policy_loss(
        PolicyLossInputs(log_probs=logp.detach(), old_log_probs=old, advantages=adv, response_mask=mask)
    )
    torch.testing.assert_close(plain.loss, torch.tensor((4.0 - 1.1) / 2))


def test_aggregations():
    x = torch.tensor([[1.0, 2.0, float("inf")], [4.0, float("nan"), float("nan")]])
    m = torch.tensor([[True, True, False], [True, False, False]])
    assert numerics.aggregate(x, m, "token_mean").item() == pytest.approx(7 / 3)
    assert numerics.aggregate(x, m, "seq_mean_token_mean").item() == pytest.approx((1.5 + 4) / 2)
    assert numerics.aggregate(x, m, "seq_mean_token_sum").item() == pytest.approx((3 + 4) / 2)
    assert numerics.aggregate(x, m, "token_mean", global_num_tokens=7).item() == pytest.approx(1.0)


def test_m2po_solver_previous_breakpoint():
    d = torch.tensor([0.01, 0.04, 0.25, 1.0], dtype=torch.float64)  # mean 0.325
    tau, before, after = m2po_threshold(d, budget=0.1)
    # S_k = [0.04, 0.13, 0.55, 1.3]; target 0.4 -> k = 2; previous breakpoint 0.04 -> tau 0.2
    assert before == pytest.approx(0.325)
    assert tau == pytest.approx(0.2, abs=1e-9)
    assert after == pytest.approx((0.04 * 2 + 0.05) / 4)
    assert m2po_threshold(d, budget=1.0)[0] == 1e5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, port, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        full = torch.tensor([1.0, 4.0, 2.0, 8.0, 3.0, 7.0, 5.0])
        shards = {0: (full[:4], (3, 1)), 1: (full[4:], (0, 3))}  # segment 0 = [1,4,2], segment 1 = [8,3,7,5]
        vals, sizes = shards[rank]
        got = numerics.whiten_segments(vals, sizes, dist.group.WORLD)
        mask = torch.ones(vals.shape[0], 2, dtype=torch.bool)
        per_token = vals[:, None].expand(-1, 2).contiguous()
        tok = numerics.token_global_normalize(per_token, mask, dist.group.WORLD)
        empty = numerics.whiten_segments(torch.zeros(0) if rank == 1 else vals, None, dist.group.WORLD)
        try:
            numerics.whiten_segments(vals, (1,) * vals.shape[0] if rank == 0 else None, dist.group.WORLD)
            mismatch = "no error"
        except ValueError as e:
            mismatch = str(e)
        results[rank] = (got, tok, empty, mismatch)
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_distributed_whitening_matches_single_process():
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(_worker, args=(_free_port(), results), nprocs=2, join=True)
    full = torch.tensor([1.0, 4.0, 2.0, 8.0, 3.0, 7.0, 5.0])
    single = torch.cat([numerics.whiten_segments(full[:3]), numerics.whiten_segments(full[3:])])
    torch.testing.assert_close(torch.cat([results[0][0], results[1][0]]), single, rtol=0, atol=1e-6)
    tok = torch.cat([results[0][1], results[1][1]])
    expected = (full - full.mean()) / full.var(unbiased=False).sqrt()
    torch.testing.assert_close(tok, expected[:, None].expand(-1, 2), rtol=0, atol=1e-6)
    torch.testing.assert_close(results[0][2], numerics.whiten_segments(full[:4]))
    assert "segment" in results[0][3] and "segment" in results[1][3]
