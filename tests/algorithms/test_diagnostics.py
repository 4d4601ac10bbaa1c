"""Multi-reward diagnostics: hand-computed examples, a loop reference, and the run summary."""

from __future__ import annotations

import math

import pytest
import torch

from relax.algorithms.diagnostics import (
    MetricSummary,
    format_summary_table,
    reward_diagnostics,
    summarize_diagnostics,
)

EPS = 1e-4
SQRT_HALF = math.sqrt(0.5)  # unbiased std of {0, 1}


def diag(rows, groups, keys, weights=None, advantages=None, **kw):
    rewards = torch.tensor(rows, dtype=torch.float32)
    n = rewards.shape[0]
    adv = torch.zeros(n) if advantages is None else torch.tensor(advantages, dtype=torch.float32)
    return reward_diagnostics(rewards, torch.tensor(groups), keys, weights, adv, **kw)


def test_three_groups_non_contiguous_hand_computed():
    # group 7 (samples 0, 2): tuples differ, weighted sums both 1.0 -> GRPO gets nothing,
    #   GDPO: z_c = ±0.5/(0.7071+eps), z_f = z_i = ∓0.25/(0.35355+eps): combined ≈ ∓0.707 != 0.
    # group 3 (samples 1, 3): sums 2.0 and 1.5 -> both methods learn.
    # group 9 (samples 4, 5): identical tuples -> nothing varies.
    rows = [
        [1.0, 0.0, 0.0],
        [1.0, 0.5, 0.5],
        [0.0, 0.5, 0.5],
        [1.0, 0.0, 0.5],
        [1.0, 1.0, 1.0],
        [1.0, 1.0, 1.0],
    ]
    out = diag(rows, [7, 3, 7, 3, 9, 9], ("correctness", "format", "integer"))

    c = [1, 1, 0, 1, 1, 1]
    assert out["reward/correctness/mean"] == pytest.approx(5 / 6)
    assert out["reward/correctness/std"] == pytest.approx(math.sqrt(5 / 6 * 1 / 6))
    assert out["reward/format/mean"] == pytest.approx(3.0 / 6)
    assert out["reward/correctness/zero_std_frac"] == pytest.approx(2 / 3)  # groups 3 and 9
    assert out["reward/format/zero_std_frac"] == pytest.approx(1 / 3)  # group 9
    assert out["reward/integer/zero_std_frac"] == pytest.approx(2 / 3)  # groups 3 and 9
    assert sum(c) == 5

    assert out["multi_reward/varied_group_frac"] == pytest.approx(2 / 3)
    assert out["multi_reward/collapse_rate"] == pytest.approx(1 / 3)
    assert out["multi_reward/gdpo_cancel_rate"] == 0.0

    # mean |w_k z_ik| over the 6 samples, per component
    a_c = 2 * 0.5 / (SQRT_HALF + EPS)
    half_std = 0.5 * SQRT_HALF  # unbiased std of {0, 0.5}
    a_f = 4 * 0.25 / (half_std + EPS)  # groups 7 and 3
    a_i = 2 * 0.25 / (half_std + EPS)  # group 7 only
    total = a_c + a_f + a_i
    assert out["gdpo/correctness/adv_share"] == pytest.approx(a_c / total, rel=1e-9)
    assert out["gdpo/format/adv_share"] == pytest.approx(a_f / total, rel=1e-9)
    assert out["gdpo/integer/adv_share"] == pytest.approx(a_i / total, rel=1e-9)


def test_equal_weight_components_with_constant_sum_cancel_in_gdpo_too():
    # correctness + format == 1 in every sample: GRPO sees a constant group, and GDPO's z_format is
    # exactly -z_correctness, so GDPO learns nothing either. Not counted as a GDPO win.
    rows = [[1, 0], [0, 1], [0, 1], [1, 0]]
    out = diag(rows, [0, 0, 0, 0], ("correctness", "format"))
    assert out["multi_reward/varied_group_frac"] == 1.0
    assert out["multi_reward/collapse_rate"] == 0.0
    assert out["multi_reward/gdpo_cancel_rate"] == 1.0
    assert out["gdpo/correctness/adv_share"] == pytest.approx(0.5)

    # the same scaled ×4 (still cancels: GDPO is scale invariant per component)
    out = diag([[4 * a, 4 * b] for a, b in rows], [0, 0, 0, 0], ("correctness", "format"), (2.0, 2.0))
    assert out["multi_reward/gdpo_cancel_rate"] == 1.0


def test_unequal_weights_grpo_collapses_gdpo_keeps():
    # weighted sums: 1*2 + 2*0 = 2 and 1*0 + 2*1 = 2 -> GRPO flat; GDPO: 1*z_c + 2*z_f = -z_c != 0.
    out = diag([[2, 0], [0, 1]], [5, 5], ("a", "b"), (1.0, 2.0))
    assert out["multi_reward/collapse_rate"] == 1.0
    assert out["multi_reward/gdpo_cancel_rate"] == 0.0
    a = 1.0 / (2 * SQRT_HALF + EPS)  # mean |z_a|: |±1| / (std {2, 0} + eps)
    b = 2.0 * 0.5 / (SQRT_HALF + EPS)
    assert out["gdpo/a/adv_share"] == pytest.approx(a / (a + b), rel=1e-9)
    # with equal weights the sums differ (2 vs 1): an ordinary informative group
    out = diag([[2, 0], [0, 1]], [5, 5], ("a", "b"))
    assert out["multi_reward/collapse_rate"] == 0.0
    # but GDPO cancels: z_a = -z_b with equal weights (up to the eps residue 0.70706 vs 0.70700)
    assert out["multi_reward/gdpo_cancel_rate"] == 1.0


def test_sums_equal_up_to_rounding_count_as_collapsed():
    # The two rows sum to 0.9 in real arithmetic, so GRPO gets no signal, but to two different
    # float64 numbers in whichever order the matrix product adds the three terms (e.g. 0.9 and
    # 0.8999999999999999 left to right, 0.9000000000000001 and 0.9 for (x0 + x2) + x1, as some BLAS
    # builds add): exact comparison (rtol=0) would miss it.
    rewards = torch.tensor([[0.2, 0.3, 0.4], [0.3, 0.4, 0.2]], dtype=torch.float64)
    args = (rewards, torch.tensor([0, 0]), ("x", "y", "z"), None, torch.zeros(2))
    assert (rewards @ torch.ones(3, dtype=torch.float64)).unique().numel() == 2
    assert reward_diagnostics(*args)["multi_reward/collapse_rate"] == 1.0
    assert reward_diagnostics(*args, rtol=0.0)["multi_reward/collapse_rate"] == 0.0


def test_single_reward_has_no_multi_reward_keys():
    out = reward_diagnostics(
        torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0]),
        torch.tensor([0, 0, 0, 1, 1, 1]),
        ("reward",),
        None,
        torch.tensor([1.0, -0.5, -0.5, 0.0, 0.0, 0.0]),
    )
    assert set(out) == {
        "reward/reward/mean", "reward/reward/std", "reward/reward/zero_std_frac",
        "advantage/mean", "advantage/std", "advantage/zero_frac",
    }
    assert out["reward/reward/mean"] == pytest.approx(0.5)
    assert out["reward/reward/std"] == pytest.approx(0.5)
    assert out["reward/reward/zero_std_frac"] == 0.0
    assert out["advantage/mean"] == 0.0
    assert out["advantage/std"] == pytest.approx(math.sqrt(1.5 / 6))
    assert out["advantage/zero_frac"] == pytest.approx(0.5)


def test_token_level_advantages_use_the_mask():
    adv = torch.tensor([[1.0, 1.0, 9.0], [-2.0, 5.0, 5.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    out = reward_diagnostics(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), ("r",), None, adv, response_mask=mask)
    assert out["advantage/mean"] == pytest.approx(-0.5)  # per sample: 1.0 and -2.0
    with pytest.raises(ValueError, match="response_mask"):
        reward_diagnostics(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), ("r",), None, adv)


def test_no_variation_anywhere_omits_shares():
    out = diag([[1, 0], [1, 0]], [0, 0], ("a", "b"))
    assert not any(k.startswith("gdpo/") for k in out)
    assert out["multi_reward/varied_group_frac"] == 0.0
    assert out["reward/a/zero_std_frac"] == 1.0


def test_without_advantages_there_are_no_advantage_keys():
    out = reward_diagnostics(torch.tensor([[1.0, 0.0], [0.0, 0.0]]), torch.tensor([0, 0]), ("a", "b"), None, None)
    assert not any(k.startswith("advantage/") for k in out)
    assert out["multi_reward/varied_group_frac"] == 1.0


@pytest.mark.parametrize(
    "rows, keys, weights, match",
    [
        ([[1.0, float("nan")]], ("a", "b"), None, r"reward 'b' of sample 0 is nan"),
        ([[1.0, 2.0]], ("a",), None, r"reward_keys has 1 name"),
        ([[1.0, 2.0]], ("a", "b"), (1.0,), r"reward_weights has 1 value"),
        ([[1.0, 2.0]], ("a", "b"), (1.0, float("inf")), r"reward_weights must be finite"),
    ],
)
def test_bad_input_is_named(rows, keys, weights, match):
    with pytest.raises(ValueError, match=match):
        diag(rows, [0], keys, weights)


def _loop_reference(rewards, group_ids, weights, eps=EPS, rtol=1e-6):
    """One group at a time, plain Python over float64 lists. Returns (collapse, cancel, varied, shares)."""
    n, k = rewards.shape
    groups: dict[int, list[int]] = {}
    for i, g in enumerate(group_ids.tolist()):
        groups.setdefault(g, []).append(i)
    terms = [[0.0] * k for _ in range(n)]
    exact = [[0.0] * k for _ in range(n)]  # without eps: judges cancellation
    collapse = cancel = varied = 0
    for members in groups.values():
        rows = [[float(rewards[i, j]) for j in range(k)] for i in members]
        is_varied = len({tuple(r) for r in rows}) > 1
        for j in range(k):
            col = [r[j] for r in rows]
            if max(col) == min(col):
                continue
            m = sum(col) / len(col)
            s = math.sqrt(sum((x - m) ** 2 for x in col) / (len(col) - 1))
            for i, x in zip(members, col):
                terms[i][j] = weights[j] * (x - m) / (s + eps)
                exact[i][j] = weights[j] * (x - m) / s
        sums = [sum(w * x for w, x in zip(weights, r)) for r in rows]
        sum_scale = sum(abs(w) * max(abs(r[j]) for r in rows) for j, w in enumerate(weights))
        comb = [sum(exact[i]) for i in members]
        comb_scale = sum(max(abs(exact[i][j]) for i in members) for j in range(k))
        sum_flat = max(sums) - min(sums) <= rtol * sum_scale
        gdpo_flat = max(comb) - min(comb) <= rtol * comb_scale
        varied += is_varied
        collapse += is_varied and sum_flat and not gdpo_flat
        cancel += is_varied and gdpo_flat
    abs_mean = [sum(abs(terms[i][j]) for i in range(n)) / n for j in range(k)]
    g = len(groups)
    return collapse / g, cancel / g, varied / g, [a / sum(abs_mean) for a in abs_mean]


@pytest.mark.parametrize("seed", range(5))
def test_vectorized_matches_a_per_group_loop(seed):
    gen = torch.Generator().manual_seed(seed)
    num_groups, size, k = 40, 4, 3
    # Per group one of three patterns, so that every rate occurs: random 0/1 values; b = 1 - a with
    # c constant (GRPO and GDPO both flat); c = (1 - a) / 2 with b constant (a + 2c = 1: GRPO flat,
    # GDPO keeps a - 2 * z_a).
    rewards = torch.randint(0, 2, (num_groups * size, k), generator=gen).to(torch.float64)
    pattern = torch.randint(0, 3, (num_groups,), generator=gen).repeat_interleave(size)
    a = rewards[:, 0]
    rewards[:, 1] = torch.where(pattern == 1, 1 - a, rewards[:, 1])
    rewards[:, 2] = torch.where(pattern == 2, (1 - a) / 2, rewards[:, 2] / 2)
    rewards[:, 1] = torch.where(pattern == 2, 0.0, rewards[:, 1])
    rewards[:, 2] = torch.where(pattern == 1, 0.25, rewards[:, 2])
    perm = torch.randperm(num_groups * size, generator=gen)  # groups become non-contiguous
    rewards = rewards[perm]
    group_ids = (torch.arange(num_groups * size) // size * 11)[perm]
    weights = (1.0, 1.0, 2.0)
    out = reward_diagnostics(rewards, group_ids, ("a", "b", "c"), weights, torch.zeros(len(rewards)))
    collapse, cancel, varied, shares = _loop_reference(rewards, group_ids, weights)
    assert collapse > 0 and cancel > 0  # the data exercise both rates
    assert out["multi_reward/collapse_rate"] == pytest.approx(collapse)
    assert out["multi_reward/gdpo_cancel_rate"] == pytest.approx(cancel)
    assert out["multi_reward/varied_group_frac"] == pytest.approx(varied)
    for key, share in zip("abc", shares):
        assert out[f"gdpo/{key}/adv_share"] == pytest.approx(share, rel=1e-12)


def test_summary_first_and_last_tenth():
    steps = [{"step": i, "reward/r/mean": float(i), "multi_reward/collapse_rate": 0.5} for i in range(20)]
    steps[19].pop("multi_reward/collapse_rate")
    steps[0]["gdpo/a/adv_share"] = 0.25
    summary = summarize_diagnostics(steps)
    assert summary["reward/r/mean"] == MetricSummary(first=0.5, last=18.5, window=2)
    assert summary["multi_reward/collapse_rate"] == MetricSummary(0.5, 0.5, 2)  # step 19 lacks it
    assert summary["gdpo/a/adv_share"] == MetricSummary(0.25, None, 2)
    assert "step" not in summary
    table = format_summary_table(summary)
    assert "| reward/r/mean | 0.5 | 18.5 |" in table
    assert "| gdpo/a/adv_share | 0.25 | — |" in table
    assert summarize_diagnostics(steps[:3])["reward/r/mean"] == MetricSummary(0.0, 2.0, 1)


# -- the group reductions come from numerics: same numbers as the former standalone implementation --


def _former_diagnostics(rewards, group_ids, weights, std_eps, rtol=1e-6):
    """The multi-reward part of ``reward_diagnostics`` as it was before it used ``numerics.Groups``
    (its own scatter reductions and GDPO step 1), kept verbatim as an independent reference."""

    def reduce(values, index, num_groups, op):
        shape = (num_groups,) + tuple(values.shape[1:])
        idx = index.view(-1, *([1] * (values.dim() - 1))).expand_as(values)
        out = torch.zeros(shape, dtype=values.dtype)
        return out.scatter_reduce(0, idx, values, reduce=op, include_self=False)

    def terms_of(r, index, num_groups, w, eps):
        count = reduce(torch.ones_like(r[:, 0]), index, num_groups, "sum")
        mean = reduce(r, index, num_groups, "sum") / count[:, None]
        centered = r - mean[index]
        sq = reduce(centered * centered, index, num_groups, "sum")
        std = (sq / (count[:, None] - 1).clamp_min(1.0)).sqrt()
        constant = reduce(r, index, num_groups, "amax") == reduce(r, index, num_groups, "amin")
        z = centered / (std[index] + eps)
        return torch.where(constant[index], torch.zeros_like(z), z) * w

    r = rewards.to(torch.float64)
    w = torch.tensor(weights, dtype=torch.float64)
    _, index = torch.unique(group_ids, return_inverse=True)
    num_groups = int(index.max()) + 1
    gmax, gmin = reduce(r, index, num_groups, "amax"), reduce(r, index, num_groups, "amin")
    constant = gmax == gmin
    out = {f"zero_std_frac/{j}": float(v) for j, v in enumerate(constant.to(torch.float64).mean(0))}
    abs_mean = terms_of(r, index, num_groups, w, std_eps).abs().mean(0)
    if abs_mean.sum() > 0:
        out.update({f"share/{j}": float(v / abs_mean.sum()) for j, v in enumerate(abs_mean)})
    varied = ~constant.all(1)
    s = r @ w
    sum_flat = reduce(s, index, num_groups, "amax") - reduce(s, index, num_groups, "amin") <= rtol * (
        torch.maximum(gmax.abs(), gmin.abs()) @ w.abs()
    )
    scale_free = terms_of(r, index, num_groups, w, 0.0)
    comb = scale_free.sum(1)
    comb_spread = reduce(comb, index, num_groups, "amax") - reduce(comb, index, num_groups, "amin")
    gdpo_flat = comb_spread <= rtol * reduce(scale_free.abs(), index, num_groups, "amax").sum(1)
    out["varied"] = float(varied.to(torch.float64).mean())
    out["collapse"] = float((varied & sum_flat & ~gdpo_flat).to(torch.float64).mean())
    out["cancel"] = float((varied & gdpo_flat).to(torch.float64).mean())
    return out


def _hard_batch(seed, kind):
    """Rewards that exercise every branch: discrete values with constant columns, components of very
    different scales, near-constant float32 values on a large offset (where the mean cancels), and
    complementary components that cancel in GDPO; group ids with gaps, or huge ones."""
    gen = torch.Generator().manual_seed(seed)
    n, k = 60 + seed, 2 + seed % 3
    if kind == "discrete":
        rewards = torch.randint(0, 3, (n, k), generator=gen).to(torch.float32)
    elif kind == "scales":
        scales = 10.0 ** torch.arange(-3, 3 * k - 3, 3)
        rewards = torch.randn(n, k, generator=gen, dtype=torch.float64) * scales
    elif kind == "offset":
        rewards = (torch.rand(n, k, generator=gen) * 0.3 + 1000).to(torch.float32)
    else:  # complementary 0/1 components plus constant ones
        a = torch.randint(0, 2, (n,), generator=gen).to(torch.float64)
        rewards = torch.stack([a, 1 - a] + [torch.full((n,), 0.5, dtype=torch.float64)] * (k - 2), dim=1)
    ids = torch.randint(0, n // 3, (n,), generator=gen)
    ids = ids * 7919 + 10**9 if seed % 2 else ids * 3  # compacted by torch.unique / used directly with gaps
    weights = tuple(torch.randn(k, generator=gen, dtype=torch.float64).tolist())
    if kind == "complementary":  # equal weights on the complementary pair: they cancel in GDPO
        weights = (1.5, 1.5) + weights[2:]
    return rewards, ids, weights


@pytest.mark.parametrize("kind", ["discrete", "scales", "offset", "complementary"])
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("std_eps", [1e-4, 1e-2])
def test_same_numbers_as_the_former_implementation(kind, seed, std_eps):
    rewards, ids, weights = _hard_batch(seed, kind)
    keys = tuple(f"k{j}" for j in range(rewards.shape[1]))
    out = reward_diagnostics(rewards, ids, keys, weights, None, std_eps=std_eps)
    ref = _former_diagnostics(rewards, ids, weights, std_eps)
    got = {f"zero_std_frac/{j}": out[f"reward/{key}/zero_std_frac"] for j, key in enumerate(keys)}
    shares = [out.get(f"gdpo/{key}/adv_share") for key in keys]
    got.update({f"share/{j}": share for j, share in enumerate(shares) if share is not None})
    got.update({name: out[f"multi_reward/{long}"] for name, long in (
        ("varied", "varied_group_frac"), ("collapse", "collapse_rate"), ("cancel", "gdpo_cancel_rate"))})
    assert got == ref  # exactly: the same float64 operations in the same order
    if kind == "complementary":
        assert ref["cancel"] > 0


# -- RLAlgorithm.reward_diagnostics: what each method logs --


def _algorithm(name, **cfg):
    from relax.algorithms import get_algorithm

    cls = get_algorithm(name)
    return cls(cls.Config(reward_keys=("a", "b"), reward_weights=(1.0, 2.0), **cfg))


def test_grpo_logs_the_method_independent_diagnostics_only():
    rewards, ids, _ = _hard_batch(1, "discrete")
    rewards = rewards[:, :2]
    adv = torch.randn(len(ids), generator=torch.Generator().manual_seed(0))
    out = _algorithm("grpo").reward_diagnostics(rewards, ids, adv)
    full = reward_diagnostics(rewards, ids, ("a", "b"), (1.0, 2.0), adv)
    assert out == {k: v for k, v in full.items() if not k.startswith("gdpo/")}
    assert "multi_reward/collapse_rate" in out and "advantage/mean" in out


def test_gdpo_adds_its_shares_with_the_epsilon_it_trains_with():
    rewards = torch.tensor([[2.0, 0.0], [0.0, 0.001], [1.0, 0.0], [1.0, 0.002]])
    ids = torch.tensor([0, 0, 1, 1])
    for eps in (1e-4, 1e-2):
        out = _algorithm("gdpo", n_samples_per_prompt=2, gdpo_std_eps=eps).reward_diagnostics(rewards, ids)
        assert out == reward_diagnostics(rewards, ids, ("a", "b"), (1.0, 2.0), None, std_eps=eps)
    # the eps matters here: component b's spread (~1e-3) is of the order of the larger eps

    def share_of_b(eps):
        gdpo = _algorithm("gdpo", n_samples_per_prompt=2, gdpo_std_eps=eps)
        return gdpo.reward_diagnostics(rewards, ids)["gdpo/b/adv_share"]

    assert share_of_b(1e-4) > share_of_b(1e-2) + 0.1
