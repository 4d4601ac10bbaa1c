"""GDPO variant axes and presets (relax/algorithms/gdpo.py).

Presets are pinned against independent transcriptions of the two NVlabs references written here:

- ``trl_reference``: the TRL-GDPO trainer's steps as tensor code on the reference's own layout
  (completions group after group, ``view(-1, G)``), float32, ``nansum`` for the weighted sum;
- ``verl_reference``: the verl-GDPO steps: token-level scores, verl's GRPO outcome advantage per
  reward with a dict of groups filled in batch order, the two token tensors added, verl's
  ``masked_whiten``; float32.

relax receives the same samples in a shuffled order (non-contiguous, large group ids). Steps 1-2 act
per group, so they are compared bit for bit after undoing the shuffle; step 3 is compared bit for
bit on the reference's batch order and, on the shuffled order, to 2 float32 ulps (a batch sum in
another order rounds differently). A float64 NumPy loop of the same formulas checks both to float32
accuracy, so a transcription error shared by the reference and relax would still be caught.
"""

import math
from collections import defaultdict

import numpy as np
import pytest
import torch

from relax.algorithms import AdvantageInputs
from relax.algorithms.gdpo import GDPO, GDPOVariant

EPS = 1e-4


def gdpo(**config) -> GDPO:
    return GDPO(GDPO.Config(**config))


def advantages_of(algo, per_sample, mask, segment_sizes=None):
    adv, _ = algo.compute_advantages(
        AdvantageInputs(rewards=per_sample, response_mask=mask, segment_sizes=segment_sizes)
    )
    return adv


def random_batch(seed, n_groups=7, group_size=5, k=3):
    """Rewards on distinct scales (1, 100, 0.01), some discrete columns, lengths 1..12, shuffled."""
    g = torch.Generator().manual_seed(seed)
    n = n_groups * group_size
    cols = [torch.randn(n, generator=g), torch.randint(0, 3, (n,), generator=g).double() * 50.0,
            torch.rand(n, generator=g) * 0.01]
    rewards = torch.stack(cols[:k], dim=1).to(torch.float32)
    rewards[:group_size, 1] = 50.0  # one group with a constant component
    ids = torch.arange(n_groups).repeat_interleave(group_size) * 977 + 10_000  # large, sparse ids
    lengths = torch.randint(1, 13, (n,), generator=g)
    # relax sees the samples in the order ``perm``: groups interleaved, each group's members in their
    # original relative order (the order in which a reference would have laid them out)
    perm = torch.randperm(n, generator=g)
    for gid in ids.unique():
        slots = (ids[perm] == gid).nonzero().squeeze(1)
        perm[slots] = perm[slots].sort().values
    return rewards, ids, lengths, perm


def mask_from(lengths, t=12):
    return torch.arange(t)[None, :] < lengths[:, None]


# ------------------------------------------------------------------------------------------------
# reference transcriptions
# ------------------------------------------------------------------------------------------------


def trl_reference(rewards_per_func, weights, group_size):
    """NVlabs TRL (apply_gdpo): contiguous groups of G, float32. -> (pre_bn, advantages)."""
    rewards_per_func = torch.nan_to_num(rewards_per_func)  # the reference's NaN handling
    all_reward_advantage = []
    for i in range(rewards_per_func.shape[1]):
        reward_i = rewards_per_func[:, i]
        mean_grouped = reward_i.view(-1, group_size).mean(dim=1).repeat_interleave(group_size, dim=0)
        std_grouped = reward_i.view(-1, group_size).std(dim=1).repeat_interleave(group_size, dim=0)
        all_reward_advantage.append((reward_i - mean_grouped) / (std_grouped + 1e-4))
    combined = torch.stack(all_reward_advantage, dim=1)
    w = torch.tensor(weights, dtype=torch.float32)
    pre_bn = (combined * w.unsqueeze(0)).nansum(dim=1)
    advantages = (pre_bn - pre_bn.mean()) / (pre_bn.std() + 1e-4)
    return pre_bn, advantages


def verl_reference(scores_a, scores_b, uids, eos_mask):
    """NVlabs verl GDPO: two rewards, GRPO outcome advantage each (eps 1e-6), sum, masked_whiten."""

    def token_level(scores):  # the reward manager puts each score on the last valid token
        out = torch.zeros(eos_mask.shape, dtype=torch.float32)
        for i in range(out.shape[0]):
            out[i, int(eos_mask[i].sum()) - 1] = scores[i]
        return out

    def grpo_outcome_advantage(token_level_rewards, epsilon=1e-6):
        scores = token_level_rewards.sum(dim=-1)
        id2score, id2mean, id2std = defaultdict(list), {}, {}
        for i in range(scores.shape[0]):
            id2score[uids[i]].append(scores[i])
        for idx in id2score:
            if len(id2score[idx]) == 1:
                id2mean[idx], id2std[idx] = torch.tensor(0.0), torch.tensor(1.0)
            else:
                id2mean[idx] = torch.mean(torch.tensor(id2score[idx]))
                id2std[idx] = torch.std(torch.tensor([id2score[idx]]))
        for i in range(scores.shape[0]):
            scores[i] = (scores[i] - id2mean[uids[i]]) / (id2std[uids[i]] + epsilon)
        return scores.unsqueeze(-1).tile([1, eos_mask.shape[1]]) * eos_mask

    def masked_mean(values, mask):
        return (values * mask).sum() / mask.sum()

    def masked_whiten(values, mask):
        mean = masked_mean(values, mask)
        var = masked_mean((values - mean) ** 2, mask)
        mask_sum = mask.sum()
        var = var * (mask_sum / (mask_sum - 1))
        return (values - mean) * torch.rsqrt(var + 1e-8)

    summed = grpo_outcome_advantage(token_level(scores_a)) + grpo_outcome_advantage(token_level(scores_b))
    return masked_whiten(summed, eos_mask)


def numpy_formula(rewards, ids, weights, eps_group, whiten):
    """float64 loops: per group z-score per column, weighted sum, then ``whiten(values)``."""
    r = np.asarray(rewards, dtype=np.float64)
    combined = np.zeros(len(r))
    for k in range(r.shape[1]):
        for gid in set(ids):
            idx = [i for i in range(len(r)) if ids[i] == gid]
            vals = r[idx, k]
            combined[idx] += weights[k] * (vals - vals.mean()) / (vals.std(ddof=1) + eps_group)
    return combined, whiten(combined)


# ------------------------------------------------------------------------------------------------
# presets vs references
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_trl_preset_is_bit_exact_against_the_trl_reference(seed):
    rewards, ids, lengths, perm = random_batch(seed)
    weights = (1.0, 0.5, 2.0)
    ref_pre_bn, ref_adv = trl_reference(rewards.clone(), weights, group_size=5)
    algo = gdpo(reward_keys=("a", "b", "c"), reward_weights=weights, n_samples_per_prompt=5,
                gdpo_preset="nvlabs-trl")
    ours = algo.normalize_rewards(rewards[perm], ids[perm])
    inverse = torch.argsort(perm)
    assert torch.equal(ours[inverse], ref_pre_bn)  # steps 1-2, bit for bit, from interleaved groups
    mask = mask_from(lengths)
    adv = advantages_of(algo, ours[inverse], mask, segment_sizes=(10, 25))  # scope rollout: one batch
    assert torch.equal(adv, torch.where(mask, ref_adv[:, None], torch.tensor(0.0)))
    shuffled = advantages_of(algo, ours, mask[perm])[inverse]
    ulp = 2.0**-23
    torch.testing.assert_close(shuffled, adv, rtol=2 * ulp, atol=2 * ulp * ref_adv.abs().max().item())

    def batch_z(x):
        return (x - x.mean()) / (x.std(ddof=1) + EPS)

    np_pre, np_adv = numpy_formula(rewards.double().numpy(), ids.tolist(), weights, EPS, batch_z)
    np.testing.assert_allclose(ref_pre_bn.numpy(), np_pre, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ref_adv.numpy(), np_adv, rtol=1e-5, atol=1e-5)


def test_trl_preset_keeps_float32_rounding_residue_of_constant_components():
    # 0.7f seven times: torch's float32 group mean is 6e-8 off 0.7f, so the reference's z is ~6e-4, not 0.
    a = torch.tensor([0.7] * 7 + [0.3, 0.7, 0.2, 0.9, 0.1, 0.5, 0.4])
    b = torch.tensor([1.0, 2.0, 4.0, 0.0, 1.0, 5.0, 3.0] * 2)
    ids = torch.tensor([3] * 7 + [8] * 7)
    only_a = torch.stack([a, torch.zeros(14)], dim=1)  # b = 0 everywhere: exact zeros in any mode
    residue = trl_reference(only_a, (1.0, 1.0), group_size=7)[0][:7]
    assert residue.abs().min() > 1e-4  # the residue is real in float32
    trl = gdpo(reward_keys=("a", "b"), n_samples_per_prompt=7, gdpo_preset="nvlabs-trl")
    assert torch.equal(trl.normalize_rewards(only_a, ids)[:7], residue)
    # the recommended semantics: the constant column of group 3 contributes exactly 0
    both = torch.stack([a, b], dim=1)
    recommended = gdpo(reward_keys=("a", "b"), n_samples_per_prompt=7).normalize_rewards(both, ids)
    assert torch.equal(recommended[:7], gdpo(reward_keys=("b",)).normalize_rewards(b, ids)[:7])


@pytest.mark.parametrize("seed", range(4))
def test_verl_preset_is_bit_exact_against_the_verl_reference(seed):
    rewards, ids, lengths, perm = random_batch(seed, k=2)
    rewards, ids, lengths = rewards[perm], ids[perm], lengths[perm]  # both see the interleaved order
    mask = mask_from(lengths)
    uids = [f"uid-{int(i)}" for i in ids]
    ref_adv = verl_reference(rewards[:, 0].clone(), rewards[:, 1].clone(), uids, mask.to(torch.float32))
    algo = gdpo(reward_keys=("a", "b"), n_samples_per_prompt=5, gdpo_preset="nvlabs-verl")
    per_sample = algo.normalize_rewards(rewards, ids)
    adv = advantages_of(algo, per_sample, mask, segment_sizes=(15, 20))
    assert torch.equal(adv, torch.where(mask, ref_adv, torch.tensor(0.0)))

    w = lengths.double().numpy()

    def token_whiten(x):  # masked_whiten in float64: token-weighted mean, unbiased token variance
        mean = (w * x).sum() / w.sum()
        var = (w * (x - mean) ** 2).sum() / (w.sum() - 1)
        return (x - mean) / math.sqrt(var + 1e-8)

    _, np_adv = numpy_formula(rewards.double().numpy(), ids.tolist(), (1.0, 1.0), 1e-6, token_whiten)
    expected = torch.where(mask, torch.from_numpy(np_adv).float()[:, None], torch.tensor(0.0))
    torch.testing.assert_close(adv, expected, rtol=1e-5, atol=1e-5)


def test_verl_preset_group_of_one_uses_mean_0_std_1():
    rewards = torch.tensor([[1.0, 2.0], [3.0, 0.0], [5.0, 1.0], [2.0, 2.0]])
    ids = torch.tensor([0, 0, 0, 9])  # sample 3 alone: verl keeps its raw scores
    per_sample = gdpo(reward_keys=("a", "b"), gdpo_preset="nvlabs-verl").normalize_rewards(rewards, ids)
    assert per_sample[3].item() == pytest.approx((2.0 / (1.0 + 1e-6)) * 2, rel=1e-6)


# ------------------------------------------------------------------------------------------------
# preset configuration
# ------------------------------------------------------------------------------------------------


def test_presets_resolve_to_their_axes_and_defaults_are_the_recommended_ones():
    recommended = GDPOVariant("mean", 1e-4, "sample", "minibatch", "zero", None)
    assert GDPOVariant.from_config(GDPO.Config()) == recommended
    trl = GDPOVariant.from_config(GDPO.Config(reward_keys=("a", "b"), gdpo_preset="nvlabs-trl"))
    assert trl == GDPOVariant("mean", 1e-4, "sample", "rollout", "formula", "nvlabs-trl")
    verl = GDPOVariant.from_config(GDPO.Config(reward_keys=("a", "b"), gdpo_preset="nvlabs-verl"))
    assert verl == GDPOVariant("mean", 1e-6, "token", "rollout", "formula", "nvlabs-verl")


@pytest.mark.parametrize("axis, value", [("gdpo_whiten_scope", "minibatch"), ("gdpo_baseline", "mean"),
                                         ("gdpo_std_eps", 1e-4), ("gdpo_constant_component", "zero")])
def test_preset_with_an_explicit_axis_is_an_error_naming_both_flags(axis, value):
    # Even a value equal to the preset's (mean) is rejected: the user asked for two sources of truth.
    with pytest.raises(ValueError, match=rf"{axis}=.*conflicts with gdpo_preset='nvlabs-trl'.*"
                                         rf"--{axis.replace('_', '-')} or --gdpo-preset"):
        GDPO.Config(reward_keys=("a", "b"), gdpo_preset="nvlabs-trl", **{axis: value})


def test_preset_reward_layout_requirements():
    with pytest.raises(ValueError, match="sums exactly two rewards without weights"):
        GDPO.Config(reward_keys=("a", "b", "c"), gdpo_preset="nvlabs-verl")
    with pytest.raises(ValueError, match="sums exactly two rewards without weights"):
        GDPO.Config(reward_keys=("a", "b"), reward_weights=(1.0, 2.0), gdpo_preset="nvlabs-verl")
    with pytest.raises(ValueError, match="more than one reward"):
        GDPO.Config(reward_keys=("a",), gdpo_preset="nvlabs-trl")
    algo = gdpo(reward_keys=("a", "b"), gdpo_preset="nvlabs-trl")
    with pytest.raises(ValueError, match="group sizes here range from 2 to 3"):
        algo.normalize_rewards(torch.rand(5, 2), torch.tensor([1, 1, 1, 2, 2]))


def test_presets_reject_nan_instead_of_replacing_it():
    rewards = torch.tensor([[1.0, 0.0], [float("nan"), 1.0], [0.0, 2.0], [3.0, 1.0]])
    for preset in ("nvlabs-trl", "nvlabs-verl"):
        with pytest.raises(ValueError, match="reward 'a' of sample 1 is nan"):
            algo = gdpo(reward_keys=("a", "b"), gdpo_preset=preset)
            algo.normalize_rewards(rewards, torch.tensor([0, 0, 1, 1]))


def test_cli_flags_choices_and_conflict_message():
    from relax.cli.arguments import build_train_parser
    from relax.cli.build import ConfigError, _algorithm_config

    parser = build_train_parser()
    with pytest.raises(SystemExit):  # argparse rejects a value outside the choices
        parser.parse_args(["--gdpo-whiten-unit", "tokens"])
    ns = parser.parse_args(
        ["--reward-keys", "a", "b", "--gdpo-preset", "nvlabs-verl", "--gdpo-std-eps", "1e-4"]
    )
    with pytest.raises(ConfigError, match=r"argument --gdpo-std-eps: .*--gdpo-std-eps or --gdpo-preset"):
        _algorithm_config(ns, GDPO)
    ns = parser.parse_args(["--reward-keys", "a", "b", "--gdpo-baseline", "leave_one_out",
                            "--gdpo-whiten-unit", "token", "--gdpo-std-eps", "0.01"])
    config = _algorithm_config(ns, GDPO)
    got = (config.gdpo_baseline, config.gdpo_whiten_unit, config.gdpo_std_eps)
    assert got == ("leave_one_out", "token", 0.01)
    with pytest.raises(SystemExit):
        parser.parse_args(["--gdpo-std-eps", "0"])


def test_relax_algorithms_gdpo_lists_the_axes():
    from relax.cli.algorithms_cmd import format_details

    text = format_details(GDPO)
    for flag in ("--gdpo-baseline", "--gdpo-std-eps", "--gdpo-whiten-unit", "--gdpo-whiten-scope",
                 "--gdpo-constant-component", "--gdpo-preset"):
        assert flag in text
    assert "(default: 1e-4)" in text


# ------------------------------------------------------------------------------------------------
# each axis on its own, hand-computed
# ------------------------------------------------------------------------------------------------


def test_leave_one_out_baseline_hand_values():
    r = torch.tensor([1.0, 2.0, 4.0, 0.0, 3.0], dtype=torch.float64)
    ids = torch.tensor([5, 5, 5, 2, 2])
    std_a = math.sqrt(((1 - 7 / 3) ** 2 + (2 - 7 / 3) ** 2 + (4 - 7 / 3) ** 2) / 2)
    std_b = math.sqrt(4.5)
    # r_i minus the mean of the OTHER members: 1-3, 2-2.5, 4-1.5; 0-3, 3-0
    expected = [-2 / (std_a + EPS), -0.5 / (std_a + EPS), 2.5 / (std_a + EPS),
                -3 / (std_b + EPS), 3 / (std_b + EPS)]
    loo = gdpo(reward_keys=("r",), gdpo_baseline="leave_one_out").decoupled_rewards(r, ids)
    torch.testing.assert_close(loo, torch.tensor(expected, dtype=torch.float64), rtol=1e-14, atol=0)
    mean = gdpo(reward_keys=("r",)).decoupled_rewards(r, ids)
    torch.testing.assert_close(loo, mean * torch.tensor([1.5, 1.5, 1.5, 2.0, 2.0], dtype=torch.float64))
    with pytest.raises(ValueError, match="leave-one-out baseline needs groups of at least 2"):
        loo_algo = gdpo(reward_keys=("r",), gdpo_baseline="leave_one_out")
        loo_algo.decoupled_rewards(r, torch.tensor([5, 5, 5, 2, 7]))


def test_std_eps_hand_values():
    r = torch.tensor([0.0, 1.0, 0.0, 3.0], dtype=torch.float64)
    ids = torch.tensor([0, 0, 1, 1])
    got = gdpo(reward_keys=("r",), gdpo_std_eps=0.5).decoupled_rewards(r, ids)
    s0, s1 = math.sqrt(0.5), math.sqrt(4.5)
    expected = [-0.5 / (s0 + 0.5), 0.5 / (s0 + 0.5), -1.5 / (s1 + 0.5), 1.5 / (s1 + 0.5)]
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64), rtol=1e-14, atol=0)


def test_token_unit_weighs_samples_by_response_length():
    values = torch.tensor([1.0, 0.0, 2.0])
    lengths = torch.tensor([3, 1, 0])  # sample 2 has no valid token: it does not enter the statistics
    mask = mask_from(lengths, t=4)
    # tokens: 1, 1, 1, 0 -> mean 0.75, unbiased var (3 * 0.25^2 + 0.75^2) / 3 = 0.25, std 0.5
    token = advantages_of(gdpo(reward_keys=("r",), gdpo_whiten_unit="token"), values, mask)
    assert token[0, 0].item() == pytest.approx(0.25 / (0.5 + EPS), rel=1e-6)
    assert token[1, 0].item() == pytest.approx(-0.75 / (0.5 + EPS), rel=1e-6)
    assert token[2].abs().sum() == 0 and token[0, 3] == 0
    # per sample: values 1, 0, 2 -> mean 1, std 1
    sample = advantages_of(gdpo(reward_keys=("r",)), values, mask)
    assert sample[0, 0].item() == pytest.approx(0.0, abs=1e-7)
    assert sample[1, 0].item() == pytest.approx(-1 / (1 + EPS), rel=1e-6)


def test_token_unit_with_equal_lengths_equals_sample_unit():
    values = torch.tensor([0.3, -1.2, 2.5, 0.7, 0.1, -0.4])
    mask = torch.ones(6, 5, dtype=torch.bool)
    sample = advantages_of(gdpo(reward_keys=("r",)), values, mask, (2, 4))
    token = advantages_of(gdpo(reward_keys=("r",), gdpo_whiten_unit="token"), values, mask, (2, 4))
    # the token statistics are those of each value repeated 5 times: same mean, std over 5n - 1
    for seg in (slice(0, 2), slice(2, 6)):
        x = values[seg].double()
        n = x.numel()
        std_tok = math.sqrt(5 * ((x - x.mean()) ** 2).sum().item() / (5 * n - 1))
        expected = (x - x.mean()) / (std_tok + EPS)
        torch.testing.assert_close(token[seg, 0].double(), expected, rtol=1e-6, atol=1e-7)
    assert not torch.equal(sample, token)  # unbiased over 5n tokens, not over n samples


def test_rollout_scope_uses_one_statistic_over_all_segments():
    values = torch.tensor([1.0, 2.0, 3.0, 4.0, 10.0, 20.0])
    mask = torch.ones(6, 2, dtype=torch.bool)
    segments = (2, 4)

    def z(xs):
        m = sum(xs) / len(xs)
        s = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))
        return [(x - m) / (s + EPS) for x in xs]

    minibatch = advantages_of(gdpo(reward_keys=("r",)), values, mask, segments)[:, 0]
    rollout_algo = gdpo(reward_keys=("r",), gdpo_whiten_scope="rollout")
    rollout = advantages_of(rollout_algo, values, mask, segments)[:, 0]
    torch.testing.assert_close(minibatch, torch.tensor(z([1, 2]) + z([3, 4, 10, 20])))
    torch.testing.assert_close(rollout, torch.tensor(z([1, 2, 3, 4, 10, 20])))
    assert rollout[1] < 0 < minibatch[1]  # sample 1 is above its mini-batch's mean, below the rollout's


def test_constant_component_zero_vs_formula_on_rounding_residue():
    ids = torch.tensor([0, 0, 0])
    constant = torch.tensor([0.1, 0.1, 0.1], dtype=torch.float64)
    zero = gdpo(reward_keys=("r",)).decoupled_rewards(constant, ids)
    formula = gdpo(reward_keys=("r",), gdpo_constant_component="formula").decoupled_rewards(constant, ids)
    assert torch.equal(zero, torch.zeros(3, dtype=torch.float64))
    mean = (0.1 + 0.1 + 0.1) / 3  # 0.10000000000000002
    dev = 0.1 - mean
    expected = dev / (math.sqrt(3 * dev * dev / 2) + EPS)
    assert expected != 0.0
    assert formula.tolist() == [expected] * 3

    # 0.1 + 0.2 != 0.3: a column that differs in the last bit is NOT constant under either rule
    x = [0.1 + 0.2, 0.3, 0.3]
    near = torch.tensor(x, dtype=torch.float64)
    zero = gdpo(reward_keys=("r",)).decoupled_rewards(near, ids)
    formula = gdpo(reward_keys=("r",), gdpo_constant_component="formula").decoupled_rewards(near, ids)
    # "zero" (shifted statistics) sees the exact deviations d * (2/3, -1/3, -1/3) ...
    d = (0.1 + 0.2) - 0.3
    s = math.sqrt(((d * 2 / 3) ** 2 + 2 * (d / 3) ** 2) / 2)
    exact = torch.tensor([2 * d / 3, -d / 3, -d / 3], dtype=torch.float64) / (s + EPS)
    torch.testing.assert_close(zero, exact, rtol=1e-6, atol=0)
    assert (zero != 0).all()
    # ... "formula" is the plain float64 computation, rounding of the mean included (sequential sums)
    m = (x[0] + x[1] + x[2]) / 3
    dev = [v - m for v in x]
    s_plain = math.sqrt((dev[0] * dev[0] + dev[1] * dev[1] + dev[2] * dev[2]) / 2)
    assert formula.tolist() == [v / (s_plain + EPS) for v in dev]
    assert not torch.allclose(formula, zero, rtol=0.5, atol=0)  # the mean's rounding dominates d here


def test_explicit_recommended_axes_equal_the_defaults_bit_for_bit():
    rewards, ids, lengths, perm = random_batch(11)
    keys, mask = ("a", "b", "c"), mask_from(lengths)
    default = gdpo(reward_keys=keys)
    explicit = gdpo(reward_keys=keys, gdpo_baseline="mean", gdpo_std_eps=1e-4, gdpo_whiten_unit="sample",
                    gdpo_whiten_scope="minibatch", gdpo_constant_component="zero")
    a, b = default.normalize_rewards(rewards, ids), explicit.normalize_rewards(rewards, ids)
    assert torch.equal(a, b)
    assert torch.equal(advantages_of(default, a, mask, (20, 15)), advantages_of(explicit, b, mask, (20, 15)))


# ------------------------------------------------------------------------------------------------
# two gloo ranks: token unit, rollout scope and a preset equal the single-process numbers
# ------------------------------------------------------------------------------------------------

DIST_CONFIGS = {
    "token_minibatch": dict(gdpo_whiten_unit="token"),
    "sample_rollout": dict(gdpo_whiten_scope="rollout"),
    "token_rollout": dict(gdpo_whiten_unit="token", gdpo_whiten_scope="rollout"),
    "trl_preset": dict(gdpo_preset="nvlabs-trl"),
}


def _dist_shards():
    """Two uneven shards (different T per rank), two segments each; the whole batch is their concat."""
    g = torch.Generator().manual_seed(5)
    values = [torch.randn(7, generator=g) * 3, torch.randn(5, generator=g) * 3 + 1]
    lengths = [torch.randint(0, 6, (7,), generator=g), torch.randint(1, 9, (5,), generator=g)]
    masks = [mask_from(lengths[0], t=6), mask_from(lengths[1], t=9)]
    return values, masks, [(3, 4), (2, 3)]


def _dist_rank(rank, port, q):
    import datetime

    import torch.distributed as dist

    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                                timeout=datetime.timedelta(seconds=30))
        values, masks, segments = _dist_shards()
        out = {}
        for name, axes in DIST_CONFIGS.items():
            algo = gdpo(reward_keys=("a", "b"), **axes)
            inputs = AdvantageInputs(rewards=values[rank], response_mask=masks[rank],
                                     segment_sizes=segments[rank])
            out[name] = algo.compute_advantages(inputs, process_group=dist.group.WORLD)[0].tolist()
        q.put((rank, out))
        dist.destroy_process_group()
    except Exception as exc:  # report instead of hanging the parent
        q.put((rank, {"__error__": repr(exc)}))


def _single_process_reference(axes):
    """The same batch on one process: the shards concatenated; for the minibatch scope (segment s pools
    every rank's segment s) the samples are reordered so that each segment is contiguous."""
    values, masks, segments = _dist_shards()
    t = max(m.shape[1] for m in masks)
    pad = [torch.nn.functional.pad(m, (0, t - m.shape[1])) for m in masks]
    algo = gdpo(reward_keys=("a", "b"), **axes)
    if axes.get("gdpo_whiten_scope") == "rollout" or "gdpo_preset" in axes:
        adv = advantages_of(algo, torch.cat(values), torch.cat(pad))
        return [adv[:7, : masks[0].shape[1]], adv[7:, : masks[1].shape[1]]]
    order = [0, 1, 2, 7, 8, 3, 4, 5, 6, 9, 10, 11]  # segment 0 of both ranks, then segment 1 of both
    adv = torch.empty(12, t)
    adv[order] = advantages_of(algo, torch.cat(values)[order], torch.cat(pad)[order], (5, 7))
    return [adv[:7, : masks[0].shape[1]], adv[7:, : masks[1].shape[1]]]


@pytest.mark.timeout(120)
def test_two_gloo_ranks_match_the_single_process_batch():
    from spawned_ranks import spawn_ranks

    results, _ = spawn_ranks(_dist_rank, 2, join_timeout_s=90)
    for rank in range(2):
        assert "__error__" not in results[rank], results[rank]
    for name, axes in DIST_CONFIGS.items():
        expected = _single_process_reference(axes)
        for rank in range(2):
            got = torch.tensor(results[rank][name])
            if name == "trl_preset":  # gathered in rank order = the single-process order: bit for bit
                assert torch.equal(got, expected[rank])
            else:  # float64 statistics summed in another order, results rounded to float32
                torch.testing.assert_close(got, expected[rank], rtol=1e-6, atol=1e-6,
                                           msg=f"{name} rank {rank}")
        assert expected[0].abs().sum() > 0
