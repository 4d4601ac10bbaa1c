"""normalize_rewards of every built-in method: hand-computed golden values.

The batch below has three prompt groups of 3 samples whose ids are neither contiguous, sorted nor
small, and one group that is constant (it must normalize to exact zeros, not NaN):

    position   0  1  2    3  4  5    6  7    8
    group id   5  2  5    9  2  5    9  2    9
    reward     1  0  2  0.5  0  3  0.5  3  0.5

    group 5: {1, 2, 3}  mean 2, unbiased std 1
    group 2: {0, 0, 3}  mean 1, unbiased std sqrt(((-1)^2 + (-1)^2 + 2^2) / 2) = sqrt(3)
    group 9: {0.5 x 3}  constant
"""

import math

import pytest
import torch

from relax.algorithms import get_algorithm

GROUP_IDS = torch.tensor([5, 2, 5, 9, 2, 5, 9, 2, 9])
REWARDS = torch.tensor([1.0, 0.0, 2.0, 0.5, 0.0, 3.0, 0.5, 3.0, 0.5])
GRPO_FAMILY = ("grpo", "gspo", "sapo", "cispo")


def make(name, **config):
    config.setdefault("n_samples_per_prompt", 3)
    cls = get_algorithm(name)
    return cls(cls.Config(**config))


def _grpo_expected():
    s5, s2 = 1.0 + 1e-6, math.sqrt(3.0) + 1e-6
    return torch.tensor(
        [-1 / s5, -1 / s2, 0.0, 0.0, -1 / s2, 1 / s5, 0.0, 2 / s2, 0.0], dtype=torch.float64
    ).float()


def _assert_close(got, expected, atol=1e-6):
    assert got.dtype == torch.float32 and got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=0, atol=atol)


@pytest.mark.parametrize("name", GRPO_FAMILY)
def test_grpo_family_group_z_score(name):
    out = make(name).normalize_rewards(REWARDS, GROUP_IDS)
    _assert_close(out, _grpo_expected())
    # the written-out numbers, to 6 decimals: -1/(1+1e-6), -1/(sqrt 3 + 1e-6), 2/(sqrt 3 + 1e-6)
    assert out[0].item() == pytest.approx(-0.999999, abs=2e-6)
    assert out[1].item() == pytest.approx(-0.577350, abs=2e-6)
    assert out[7].item() == pytest.approx(1.154700, abs=2e-6)
    # the constant group is exactly 0 (0 / (0 + 1e-6)), never NaN
    assert out[[3, 6, 8]].tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("name", GRPO_FAMILY)
def test_dr_grpo_centres_only(name):
    out = make(name, grpo_std_normalization=False).normalize_rewards(REWARDS, GROUP_IDS)
    # exact in float32: the means 2, 1, 0.5 are representable
    assert torch.equal(out, torch.tensor([-1.0, -1.0, 0.0, 0.0, -1.0, 1.0, 0.0, 2.0, 0.0]))


def test_grpo_combines_components_with_weights_before_normalizing():
    # column 0 + 0.5 * column 1 == REWARDS exactly, so the expected values are those of the 1-D case;
    # normalizing each column first (or ignoring the weights) would give something else.
    col1 = torch.tensor([2.0, 0.0, 4.0, 1.0, 2.0, 0.0, 1.0, 2.0, 3.0])
    col0 = REWARDS - 0.5 * col1
    rewards = torch.stack([col0, col1], dim=1)
    algo = make("grpo", reward_keys=("a", "b"), reward_weights=(1.0, 0.5))
    _assert_close(algo.normalize_rewards(rewards, GROUP_IDS), _grpo_expected())
    equal_weights = make("grpo", reward_keys=("a", "b")).normalize_rewards(rewards, GROUP_IDS)
    assert not torch.allclose(equal_weights, _grpo_expected(), atol=1e-3)


def test_group_ids_may_be_negative_or_huge():
    # ids that cannot index a dense table take a different code path; the result must not change
    ids = torch.tensor([-7, 10**12, -7, 2**40 + 3, 10**12, -7, 2**40 + 3, 10**12, 2**40 + 3])
    remapped = {-7: 5, 10**12: 2, 2**40 + 3: 9}
    assert [remapped[int(i)] for i in ids] == GROUP_IDS.tolist()
    for name in ("grpo", "rloo", "reinforce_plus_plus_baseline"):
        algo = make(name, normalize_advantages=name.startswith("reinforce"))
        assert torch.equal(algo.normalize_rewards(REWARDS, ids), algo.normalize_rewards(REWARDS, GROUP_IDS)), name


def test_grpo_large_offset_does_not_cancel():
    # 1e6 + {1, 2, 3} are exact in float32: the z-scores must be those of {1, 2, 3}
    out = make("grpo").normalize_rewards(torch.tensor([1e6 + 1, 1e6 + 2, 1e6 + 3]), torch.tensor([0, 0, 0]))
    torch.testing.assert_close(out, torch.tensor([-1 / (1 + 1e-6), 0.0, 1 / (1 + 1e-6)]), rtol=0, atol=1e-7)


def test_grpo_singleton_groups_give_zeros_not_nan():
    out = make("grpo", n_samples_per_prompt=1).normalize_rewards(torch.tensor([3.0, -1.0]), torch.tensor([7, 8]))
    assert out.tolist() == [0.0, 0.0]


def test_rloo_leave_one_out():
    out = make("rloo").normalize_rewards(REWARDS, GROUP_IDS)
    # r_i - mean of the other two: group 5: 1 - 2.5, 2 - 2, 3 - 1.5; group 2: 0 - 1.5, 0 - 1.5, 3 - 0
    assert torch.equal(out, torch.tensor([-1.5, -1.5, 0.0, 0.0, -1.5, 1.5, 0.0, 3.0, 0.0]))


def test_rloo_rejects_a_singleton_group():
    with pytest.raises(ValueError, match="at least 2"):
        make("rloo").normalize_rewards(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0, 0, 1]))


def test_reinforce_plus_plus_baseline_subtracts_group_mean_only():
    out = make("reinforce_plus_plus_baseline", normalize_advantages=True).normalize_rewards(REWARDS, GROUP_IDS)
    assert torch.equal(out, torch.tensor([-1.0, -1.0, 0.0, 0.0, -1.0, 1.0, 0.0, 2.0, 0.0]))


@pytest.mark.parametrize("name", ["ppo", "reinforce_plus_plus", "m2po"])
def test_methods_without_group_baseline_keep_the_raw_reward(name):
    config = {"normalize_advantages": True} if name == "reinforce_plus_plus" else {}
    out = make(name, **config).normalize_rewards(REWARDS, GROUP_IDS)
    assert out.dtype == torch.float32 and torch.equal(out, REWARDS)


def _gdpo_z(values):
    """Plain-Python per-group z-score of one component, std unbiased, eps 1e-4, constant -> 0."""
    if max(values) == min(values):
        return [0.0] * len(values)
    m = sum(values) / len(values)
    s = math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))
    return [(v - m) / (s + 1e-4) for v in values]


def test_gdpo_per_component_then_weighted_sum():
    #            positions of group 5: 0, 2, 5; group 2: 1, 4, 7; group 9: 3, 6, 8
    a = {5: [1.0, 0.0, 0.0], 2: [1.0, 1.0, 1.0], 9: [0.0, 1.0, 0.5]}
    b = {5: [0.5, 0.5, 0.5], 2: [0.0, 1.0, 1.0], 9: [0.1, 0.1, 0.1]}
    positions = {5: [0, 2, 5], 2: [1, 4, 7], 9: [3, 6, 8]}
    rewards = torch.zeros(9, 2, dtype=torch.float64)
    expected = torch.zeros(9, dtype=torch.float64)
    for g, pos in positions.items():
        rewards[pos, 0] = torch.tensor(a[g], dtype=torch.float64)
        rewards[pos, 1] = torch.tensor(b[g], dtype=torch.float64)
        za, zb = _gdpo_z(a[g]), _gdpo_z(b[g])
        expected[pos] = torch.tensor([1.0 * x + 2.0 * y for x, y in zip(za, zb)], dtype=torch.float64)
    algo = make("gdpo", reward_keys=("a", "b"), reward_weights=(1.0, 2.0))
    out = algo.normalize_rewards(rewards.float(), GROUP_IDS)
    _assert_close(out, expected.float())
    # hand values: group 5 column a {1,0,0}: mean 1/3, std sqrt(1/3) = 0.577350
    assert out[0].item() == pytest.approx((2 / 3) / (math.sqrt(1 / 3) + 1e-4), abs=1e-6)
    assert out[0].item() == pytest.approx(1.154500, abs=2e-6)
    # group 9: column a {0, 1, 0.5} -> (-0.5, 0.5, 0) / (0.5 + 1e-4); column b constant 0.1 -> exactly 0
    assert out[6].item() == pytest.approx(0.5 / 0.5001, abs=1e-6)
    assert out[8].item() == 0.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [3, 7, 8])
def test_gdpo_constant_components_give_exact_zero(n, dtype):
    # 0.1 and 308.95172119140625 repeated n times: a float mean of the copies need not be the value
    # itself (in float64, sum([0.1] * 3) / 3 = 0.10000000000000002), so a plain
    # (r - mean) / (std + eps) can leave a residue; the spec says a constant component gives exactly 0.
    rewards = torch.stack(
        [torch.full((n,), 0.1, dtype=dtype), torch.full((n,), 308.95172119140625, dtype=dtype)], dim=1
    )
    ids = torch.tensor([3] * n)
    out = make("gdpo", reward_keys=("a", "b"), n_samples_per_prompt=n).normalize_rewards(rewards, ids)
    assert torch.equal(out, torch.zeros(n))


def test_gdpo_rejects_non_finite_rewards_naming_key_and_sample():
    rewards = torch.tensor([[1.0, 0.0], [0.0, float("nan")], [1.0, 1.0], [0.0, 1.0]])
    algo = make("gdpo", reward_keys=("correct", "format"), n_samples_per_prompt=2)
    with pytest.raises(ValueError, match=r"'format'.*sample 1"):
        algo.normalize_rewards(rewards, torch.tensor([0, 0, 1, 1]))


@pytest.mark.parametrize("name", ["grpo", "gdpo", "rloo"])
def test_wrong_number_of_reward_columns(name):
    algo = make(name, reward_keys=("a", "b"))
    with pytest.raises(ValueError, match="reward_keys"):
        algo.normalize_rewards(torch.zeros(6, 3), torch.tensor([0, 0, 0, 1, 1, 1]))


@pytest.mark.parametrize("name", ["grpo", "gdpo"])
def test_group_ids_length_mismatch(name):
    algo = make(name, reward_keys=("a", "b"))
    with pytest.raises(ValueError, match="group_ids"):
        algo.normalize_rewards(torch.rand(6, 2), torch.tensor([0, 0, 0, 1, 1]))


def test_grpo_group_has_signal_drops_constant_groups():
    keep = make("grpo").group_has_signal(REWARDS, GROUP_IDS)
    assert keep.tolist() == [True, True, True, False, True, True, False, True, False]


def test_gdpo_group_has_signal_is_component_aware():
    # group 0: both components constant -> no signal; group 1: only column b varies -> signal
    rewards = torch.tensor([[1.0, 0.2], [1.0, 0.2], [0.0, 0.0], [0.0, 1.0]])
    keep = make("gdpo", reward_keys=("a", "b"), n_samples_per_prompt=2).group_has_signal(
        rewards, torch.tensor([0, 0, 1, 1])
    )
    assert keep.tolist() == [False, False, True, True]
