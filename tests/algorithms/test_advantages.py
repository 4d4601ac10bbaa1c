"""compute_advantages of every built-in method: golden values and plain-loop references.

Padded positions hold NaN (values, KL) so that any leak of a masked position shows up.
"""

import math

import pytest
import torch

from relax.algorithms import AdvantageInputs, get_algorithm
from relax.algorithms import numerics

NAN = float("nan")
# lengths 2, 4, 1 of T = 4
MASK = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.bool)
BROADCAST_FAMILY = ("grpo", "gspo", "sapo", "cispo", "rloo", "m2po")


def make(name, **config):
    cls = get_algorithm(name)
    return cls(cls.Config(**config))


def _inputs(rewards, mask=MASK, **kw):
    return AdvantageInputs(rewards=torch.as_tensor(rewards, dtype=torch.float32), response_mask=mask, **kw)


# -- broadcast (GRPO family, RLOO, M2PO) --


@pytest.mark.parametrize("name", BROADCAST_FAMILY)
def test_broadcast_to_valid_tokens(name):
    adv, ret = make(name).compute_advantages(_inputs([0.5, -1.0, 2.0]))
    expected = torch.tensor([[0.5, 0.5, 0, 0], [-1.0, -1.0, -1.0, -1.0], [2.0, 0, 0, 0]])
    assert adv.dtype == torch.float32 and torch.equal(adv, expected)
    assert torch.equal(ret, expected)


@pytest.mark.parametrize("name", ["grpo", "cispo"])
def test_optional_token_whitening(name):
    # normalize_advantages: unbiased masked whitening over the 7 valid tokens
    rewards = [0.5, -1.0, 2.0]
    adv, _ = make(name, normalize_advantages=True).compute_advantages(_inputs(rewards))
    tokens = [0.5, 0.5, -1.0, -1.0, -1.0, -1.0, 2.0]
    m = sum(tokens) / 7
    var = sum((t - m) ** 2 for t in tokens) / 6
    scale = 1 / math.sqrt(var + 1e-8)
    expected = torch.zeros(3, 4, dtype=torch.float64)
    for i, r in enumerate(rewards):
        expected[i][MASK[i]] = (r - m) * scale
    torch.testing.assert_close(adv, expected.float(), rtol=0, atol=1e-6)
    assert adv[~MASK].eq(0).all()


# -- GDPO: per-segment sample-level whitening, then broadcast --


def _whiten(xs, eps=1e-4):
    if max(xs) == min(xs):
        return [0.0] * len(xs)
    m = sum(xs) / len(xs)
    s = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))
    return [(x - m) / (s + eps) for x in xs]


def test_gdpo_whitens_each_segment_then_broadcasts():
    x = [1.0, 2.0, 4.0, 0.5, 0.5, -1.0, 3.0]
    mask = torch.tensor(
        [[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1]], dtype=torch.bool
    )
    algo = make("gdpo", reward_keys=("a", "b"))
    adv, ret = algo.compute_advantages(_inputs(x, mask, segment_sizes=(3, 2, 2)))
    per_sample = _whiten(x[0:3]) + _whiten(x[3:5]) + _whiten(x[5:7])
    expected = torch.tensor(per_sample, dtype=torch.float64).float()[:, None] * mask
    # float64 statistics cast to float32: equal to the reference up to one float32 ulp
    torch.testing.assert_close(adv, expected, rtol=1.2e-7, atol=0)
    assert torch.equal(ret, adv)
    # hand values: segment {1, 2, 4}: mean 7/3, std sqrt(7/3); segment {-1, 3}: +-2 / (2 sqrt 2 + 1e-4)
    assert adv[0, 0].item() == pytest.approx((-4 / 3) / (math.sqrt(7 / 3) + 1e-4), abs=1e-6)
    assert adv[6, 0].item() == pytest.approx(2 / (2 * math.sqrt(2) + 1e-4), abs=1e-6)
    # the all-equal segment is exactly zero; sample-level: token counts don't weight the statistics
    assert adv[3:5].eq(0).all()


def test_gdpo_without_segments_is_one_segment_and_differs_from_segmented():
    x = [1.0, 2.0, 4.0, 0.5, 0.5, -1.0, 3.0]
    mask = torch.ones(7, 2, dtype=torch.bool)
    algo = make("gdpo", reward_keys=("a", "b"))
    whole, _ = algo.compute_advantages(_inputs(x, mask))
    one_seg, _ = algo.compute_advantages(_inputs(x, mask, segment_sizes=(7,)))
    assert torch.equal(whole, one_seg)
    torch.testing.assert_close(whole[:, 0], torch.tensor(_whiten(x)).float(), rtol=1.2e-7, atol=0)
    segmented, _ = algo.compute_advantages(_inputs(x, mask, segment_sizes=(3, 4)))
    # sample 1 (value 2.0) lies below its segment's mean 7/3 but above the merged mean 10/7: the sign flips
    assert whole[1, 0] > 0 > segmented[1, 0]


def test_gdpo_all_equal_segment_is_exactly_zero_even_if_the_mean_rounds():
    # float64 0.1 three times: the float64 mean is 0.10000000000000002, (x - mean) is not 0; the spec
    # says an all-equal segment gives exact zeros
    x = torch.tensor([0.1, 0.1, 0.1, 1.0, 2.0], dtype=torch.float64)
    algo = make("gdpo", reward_keys=("a", "b"))
    adv, _ = algo.compute_advantages(
        AdvantageInputs(rewards=x, response_mask=torch.ones(5, 1, dtype=torch.bool), segment_sizes=(3, 2))
    )
    assert adv[:3].eq(0).all()
    assert adv[3, 0].item() == pytest.approx(-0.5 / (math.sqrt(0.5) + 1e-4), abs=1e-6)


def test_gdpo_rejects_non_finite_input():
    with pytest.raises(ValueError, match="non-finite"):
        make("gdpo", reward_keys=("a", "b")).compute_advantages(_inputs([1.0, float("inf")], torch.ones(2, 1, dtype=torch.bool)))


# -- REINFORCE++-baseline: broadcast, then global token normalization (population variance) --


def _token_normalize(per_token_rows):
    """Plain-Python REINFORCE++ normalization of a list of per-row lists of valid-token values."""
    flat = [v for row in per_token_rows for v in row]
    m = sum(flat) / len(flat)
    var = sum((v - m) ** 2 for v in flat) / len(flat)
    inv = max(var, 1e-8) ** -0.5
    return [[(v - m) * inv for v in row] for row in per_token_rows]


def _rows_to_tensor(rows, t_len):
    out = torch.zeros(len(rows), t_len, dtype=torch.float64)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.float64)
    return out


def test_reinforce_plus_plus_baseline_global_token_normalization():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=torch.bool)
    algo = make("reinforce_plus_plus_baseline", normalize_advantages=True)
    adv, _ = algo.compute_advantages(_inputs([1.0, -1.0, 2.0], mask))
    # tokens 1, 1, -1, 2, 2, 2: mean 7/6, population variance 246/36/6
    sigma = math.sqrt((2 / 36 + 169 / 36 + 75 / 36) / 6)
    assert sigma == pytest.approx(1.067187, abs=1e-6)
    expected = _rows_to_tensor(_token_normalize([[1.0, 1.0], [-1.0], [2.0, 2.0, 2.0]]), 3)
    assert expected[0, 0].item() == pytest.approx((-1 / 6) / sigma)
    torch.testing.assert_close(adv, expected.float(), rtol=1.2e-7, atol=1e-7)


def test_reinforce_plus_plus_baseline_constant_batch_gives_zeros():
    mask = torch.tensor([[1, 1], [1, 0]], dtype=torch.bool)
    adv, _ = make("reinforce_plus_plus_baseline", normalize_advantages=True).compute_advantages(
        _inputs([0.3, 0.3], mask)
    )
    assert torch.equal(adv, torch.zeros(2, 2))


# -- REINFORCE++: KL-shaped token rewards, discounted returns, global token normalization --


def _reinforce_pp_reference(scores, kl, lengths, kl_coef, gamma):
    rows = []
    for r, k, n in zip(scores, kl, lengths):
        token_r = [-kl_coef * k[t] + (r if t == n - 1 else 0.0) for t in range(n)]
        g, ret = 0.0, [0.0] * n
        for t in reversed(range(n)):
            g = token_r[t] + gamma * g
            ret[t] = g
        rows.append(ret)
    return rows


def test_reinforce_plus_plus_returns_and_normalization():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    kl = torch.tensor([[0.2, -0.4, NAN], [0.0, 1.0, 0.5]])
    algo = make("reinforce_plus_plus", kl_coef=0.1, gamma=0.5, normalize_advantages=True)
    adv, _ = algo.compute_advantages(_inputs([1.0, -2.0], mask, kl=kl))
    # hand-computed discounted returns: row 0: r = (-0.02, 1.04) -> G = (0.5, 1.04)
    #                                  row 1: r = (0, -0.1, -2.05) -> G = (-0.5625, -1.125, -2.05)
    returns = _reinforce_pp_reference([1.0, -2.0], kl.tolist(), [2, 3], 0.1, 0.5)
    assert returns[0] == pytest.approx([0.5, 1.04])
    assert returns[1] == pytest.approx([-0.5625, -1.125, -2.05])
    expected = _rows_to_tensor(_token_normalize(returns), 3)
    torch.testing.assert_close(adv, expected.float(), rtol=1e-6, atol=1e-6)
    assert adv[0, 2].item() == 0.0


def test_reinforce_plus_plus_without_kl_puts_the_score_on_the_last_valid_token():
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    algo = make("reinforce_plus_plus", gamma=0.9, normalize_advantages=True)
    adv, _ = algo.compute_advantages(_inputs([1.0, 0.0, -1.0], mask))
    kl0 = [[0.0] * 4] * 3
    returns = _reinforce_pp_reference([1.0, 0.0, -1.0], kl0, [3, 2, 4], 0.0, 0.9)
    assert returns[0] == pytest.approx([0.81, 0.9, 1.0])
    expected = _rows_to_tensor(_token_normalize(returns), 4)
    torch.testing.assert_close(adv, expected.float(), rtol=1e-6, atol=1e-6)


# -- PPO: GAE against a plain Python loop --


def _gae_reference(scores, values, kl, lengths, kl_coef, gamma, lam):
    adv_rows, ret_rows = [], []
    for r, v, k, n in zip(scores, values, kl, lengths):
        rew = [-kl_coef * k[t] + (r if t == n - 1 else 0.0) for t in range(n)]
        adv, last = [0.0] * n, 0.0
        for t in reversed(range(n)):
            next_v = v[t + 1] if t + 1 < n else 0.0
            delta = rew[t] + gamma * next_v - v[t]
            last = delta + gamma * lam * last
            adv[t] = last
        adv_rows.append(adv)
        ret_rows.append([a + v[t] for t, a in enumerate(adv)])
    return adv_rows, ret_rows


def test_ppo_gae_hand_computed():
    # one row, T = 3, 2 valid tokens, gamma = lam = 1, no KL; the score sits on token 1, NOT on the
    # last column. delta_1 = 1 - 0.25, delta_0 = 0.25 - 0.5; A = (0.5, 0.75); returns = A + V = (1, 1)
    mask = torch.tensor([[1, 1, 0]], dtype=torch.bool)
    values = torch.tensor([[0.5, 0.25, NAN]])
    adv, ret = make("ppo").compute_advantages(_inputs([1.0], mask, values=values))
    assert torch.equal(adv, torch.tensor([[0.5, 0.75, 0.0]]))
    assert torch.equal(ret, torch.tensor([[1.0, 1.0, 0.0]]))


def test_ppo_gae_matches_python_loop():
    g = torch.Generator().manual_seed(0)
    lengths = [2, 5, 3, 1]
    t_len = 5
    mask = torch.arange(t_len)[None, :] < torch.tensor(lengths)[:, None]
    values = torch.randn(4, t_len, generator=g)
    kl = torch.randn(4, t_len, generator=g) * 0.1
    values[~mask] = NAN
    kl[~mask] = 1e30
    scores = [1.0, -0.5, 2.0, 0.25]
    algo = make("ppo", gamma=0.9, lam=0.8, kl_coef=0.05)
    adv, ret = algo.compute_advantages(_inputs(scores, mask, values=values, kl=kl))
    ref_adv, ref_ret = _gae_reference(scores, values.double().tolist(), kl.double().tolist(), lengths, 0.05, 0.9, 0.8)
    torch.testing.assert_close(adv, _rows_to_tensor(ref_adv, t_len).float(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ret, _rows_to_tensor(ref_ret, t_len).float(), rtol=1e-6, atol=1e-6)
    assert adv[~mask].eq(0).all() and ret[~mask].eq(0).all()


@pytest.mark.parametrize("name", ["grpo", "rloo", "gdpo"])
def test_non_finite_reward_is_an_error(name):
    algo = make(name, reward_keys=("a", "b")) if name == "gdpo" else make(name)
    with pytest.raises(ValueError, match="non-finite"):
        algo.compute_advantages(_inputs([0.5, NAN, 2.0]))


def test_ppo_non_finite_critic_value_on_a_valid_token_is_an_error():
    values = torch.tensor([[0.5, NAN, 0, 0], [0.0] * 4, [0.0] * 4])
    with pytest.raises(ValueError, match="non-finite"):
        make("ppo").compute_advantages(_inputs([1.0, 0.0, 1.0], values=values))


def test_ppo_non_finite_kl_on_a_valid_token_is_an_error():
    # a NaN KL on a VALID token must not flow silently into the advantages (REINFORCE++ raises here)
    kl = torch.zeros(3, 4)
    kl[1, 2] = NAN
    algo = make("ppo", kl_coef=0.1)
    with pytest.raises(ValueError, match="non-finite"):
        algo.compute_advantages(_inputs([1.0, 0.0, 1.0], values=torch.zeros(3, 4), kl=kl))


def test_ppo_needs_values():
    with pytest.raises(ValueError, match="values"):
        make("ppo").compute_advantages(_inputs([1.0, 0.0, 1.0]))


# -- numerics scans used above, directly --


def test_numerics_discounted_returns_and_gae_agree_with_loops():
    g = torch.Generator().manual_seed(1)
    lengths = [4, 1, 3]
    mask = torch.arange(4)[None, :] < torch.tensor(lengths)[:, None]
    r = torch.randn(3, 4, generator=g, dtype=torch.float64)
    v = torch.randn(3, 4, generator=g, dtype=torch.float64)
    for gamma in (1.0, 0.7):
        got = numerics.discounted_returns(r, mask, gamma)
        for i, n in enumerate(lengths):
            acc = 0.0
            for t in reversed(range(n)):
                acc = r[i, t].item() + gamma * acc
                assert got[i, t].item() == pytest.approx(acc, abs=1e-12)
    adv, ret = numerics.gae(r, v, mask, 0.95, 0.9)
    for i, n in enumerate(lengths):
        last = 0.0
        for t in reversed(range(n)):
            nv = v[i, t + 1].item() if t + 1 < n else 0.0
            last = r[i, t].item() + 0.95 * nv - v[i, t].item() + 0.95 * 0.9 * last
            assert adv[i, t].item() == pytest.approx(last, abs=1e-12)
            assert ret[i, t].item() == pytest.approx(last + v[i, t].item(), abs=1e-12)


def test_numerics_terminal_reward_on_last_valid_token():
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 1, 1]], dtype=torch.bool)
    out = numerics.terminal_token_rewards(torch.tensor([2.0, 5.0, -1.0]), mask)
    assert out.tolist() == [[0.0, 2.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, -1.0]]
