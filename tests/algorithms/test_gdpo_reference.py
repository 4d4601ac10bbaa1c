"""GDPO against two independent reference implementations written here with plain loops.

(a) ``trl_reference``: the NVlabs TRL formula (arXiv 2601.05242 Eq. 4 and 7 as in the TRL-GDPO
    trainer): per reward and group ``(r - mean) / (std + 1e-4)`` in float32 with torch's unbiased
    std, NaN -> 0, weighted sum, then ``(x - mean) / (std + 1e-4)`` over the batch (here: over each
    segment), float32, no special case for constant components or segments.
(b) ``relax_reference``: this project's semantics in Python floats (float64): the same formula, but
    a component that is exactly constant within its group contributes exactly 0, the combined value
    travels as float32 between the reward and the advantage stage, and a segment whose values are all
    equal whitens to exact zeros.

relax's GDPO must match (b) to float32 rounding everywhere, match (a) closely on generic inputs, and
differ from (a) exactly where (b) says so: constant components whose float32 mean is not the value.
"""

import math
import random
import struct

import pytest
import torch

from relax.algorithms import AdvantageInputs, AlgorithmConfig, get_algorithm

EPS = 1e-4


def f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def _segments(n, segment_sizes):
    sizes = segment_sizes or (n,)
    out, start = [], 0
    for s in sizes:
        out.append(range(start, start + s))
        start += s
    return out


def trl_reference(rewards, group_ids, weights, segment_sizes=None):
    """(a) NVlabs/TRL GDPO in float32 torch ops, one group / one segment at a time."""
    r = torch.tensor(rewards, dtype=torch.float32)
    n, k = r.shape
    combined = torch.zeros(n, dtype=torch.float32)
    for col in range(k):
        z = torch.zeros(n, dtype=torch.float32)
        for g in set(group_ids):
            idx = torch.tensor([i for i in range(n) if group_ids[i] == g])
            vals = r[idx, col]
            z[idx] = torch.nan_to_num((vals - vals.mean()) / (vals.std() + EPS))
        combined += torch.tensor(weights[col], dtype=torch.float32) * z
    out = torch.zeros(n, dtype=torch.float32)
    for seg in _segments(n, segment_sizes):
        idx = torch.tensor(list(seg), dtype=torch.int64)
        vals = combined[idx]
        if len(idx):
            out[idx] = torch.nan_to_num((vals - vals.mean()) / (vals.std() + EPS))
    return out


def _z(values):
    if max(values) == min(values):
        return [0.0] * len(values)
    m = sum(values) / len(values)
    s = math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))
    return [(v - m) / (s + EPS) for v in values]


def relax_reference(rewards, group_ids, weights, segment_sizes=None):
    """(b) This project's GDPO semantics in plain Python floats (float64)."""
    rewards = [[f32(v) for v in row] for row in rewards]  # the float32 wire format of the inputs
    n, k = len(rewards), len(weights)
    combined = [0.0] * n
    for col in range(k):
        for g in set(group_ids):
            members = [i for i in range(n) if group_ids[i] == g]
            for i, z in zip(members, _z([rewards[i][col] for i in members])):
                combined[i] += weights[col] * z
    combined = [f32(c) for c in combined]  # normalize_rewards returns float32
    out = [0.0] * n
    for seg in _segments(n, segment_sizes):
        vals = [combined[i] for i in seg]
        if vals:
            for i, w in zip(seg, _z(vals)):
                out[i] = w
    return torch.tensor(out, dtype=torch.float64).float()


def relax_gdpo(rewards, group_ids, weights, segment_sizes=None, group_size=2):
    keys = tuple(f"r{i}" for i in range(len(weights)))
    algo = get_algorithm("gdpo")(
        AlgorithmConfig(reward_keys=keys, reward_weights=weights, n_samples_per_prompt=group_size)
    )
    per_sample = algo.normalize_rewards(torch.tensor(rewards, dtype=torch.float32), torch.tensor(group_ids))
    mask = torch.ones(len(group_ids), 1, dtype=torch.bool)
    adv, _ = algo.compute_advantages(
        AdvantageInputs(rewards=per_sample, response_mask=mask, segment_sizes=segment_sizes)
    )
    return adv[:, 0]


def random_batch(seed, n_groups=6, group_size=4, k=3, discrete=False):
    rng = random.Random(seed)
    ids = rng.sample(range(1000, 5000), n_groups)  # large, non-contiguous ids
    group_ids = [g for g in ids for _ in range(group_size)]
    rng.shuffle(group_ids)  # groups interleaved through the batch
    if discrete:
        rewards = [[rng.choice([0.0, 0.5, 1.0]) for _ in range(k)] for _ in group_ids]
    else:
        rewards = [[rng.gauss(0, 1) * 10 ** c for c in range(k)] for _ in group_ids]
    return rewards, group_ids


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("discrete", [False, True])
def test_matches_both_references_on_random_batches(seed, discrete):
    rewards, group_ids = random_batch(seed, discrete=discrete)
    weights = (1.0, 0.5, 2.0)
    segments = (7, 5, 12)
    got = relax_gdpo(rewards, group_ids, weights, segments)
    b = relax_reference(rewards, group_ids, weights, segments)
    torch.testing.assert_close(got, b, rtol=3e-7, atol=1e-6)
    # (a) differs only by float32 rounding here (0, 0.5, 1 are exact, so constant columns give 0 in both)
    a = trl_reference(rewards, group_ids, weights, segments)
    torch.testing.assert_close(got, a, rtol=1e-4, atol=1e-4)


def test_references_differ_on_constant_components_with_float32_rounding():
    # Two groups of 8 whose components are constant, with values whose float32 mean over 8 copies is
    # not the value itself (e.g. 0.1 and 0.7). TRL leaves a residue ~1e-4 per group that the batch
    # whitening blows up to O(1) advantages; relax gives exact zeros (no signal, no gradient).
    rewards = [[0.1, 0.7]] * 8 + [[0.7, 3.3]] * 8
    group_ids = [11] * 8 + [22] * 8
    weights = (1.0, 1.0)
    a = trl_reference(rewards, group_ids, weights)
    got = relax_gdpo(rewards, group_ids, weights, group_size=8)
    assert torch.equal(got, torch.zeros(16))
    assert torch.equal(relax_reference(rewards, group_ids, weights), torch.zeros(16))
    assert a.abs().max().item() > 0.5, a


def test_a_constant_component_inside_a_varying_batch_differs_only_slightly():
    rewards = [[0.1, float(i % 2)] for i in range(8)] + [[float(i % 3), 0.7] for i in range(8)]
    group_ids = [3] * 8 + [4] * 8
    weights = (1.0, 1.0)
    got = relax_gdpo(rewards, group_ids, weights, group_size=8)
    a = trl_reference(rewards, group_ids, weights)
    torch.testing.assert_close(got, relax_reference(rewards, group_ids, weights), rtol=3e-7, atol=1e-6)
    diff = (got - a).abs().max().item()
    assert 0 < diff < 1e-3, diff


def test_scale_invariance_of_a_component():
    rewards, group_ids = random_batch(7, k=2)
    base = relax_gdpo(rewards, group_ids, (1.0, 1.0))
    scaled = relax_gdpo([[r[0] * 1000.0, r[1]] for r in rewards], group_ids, (1.0, 1.0))
    # only the 1e-4 in (std + 1e-4) leaks the scale
    torch.testing.assert_close(scaled, base, rtol=0, atol=1e-3)
    assert not torch.equal(scaled, base)


def test_group_of_two_gives_plus_minus_one_over_sqrt_two():
    # G = 2: each varying component becomes +-(d/2) / (d/sqrt(2) + 1e-4), whatever its spread d
    algo = get_algorithm("gdpo")(AlgorithmConfig(reward_keys=("a", "b"), n_samples_per_prompt=2))
    rewards = torch.tensor([[0.0, 5.0], [1.0, 5.0], [0.0, 0.0], [1000.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    out = algo.normalize_rewards(rewards, torch.tensor([0, 0, 1, 1, 2, 2]))
    c1 = 0.5 / (1 / math.sqrt(2) + EPS)
    c1000 = 500 / (1000 / math.sqrt(2) + EPS)
    assert c1 == pytest.approx(0.707007, abs=1e-6) and c1000 == pytest.approx(1 / math.sqrt(2), abs=1e-6)
    torch.testing.assert_close(out[:4], torch.tensor([-c1, c1, -c1000, c1000]), rtol=0, atol=1e-7)
    # components with opposite signs and equal spread cancel exactly (rho = -1, equal weights)
    assert out[4:].tolist() == [0.0, 0.0]


def test_weights_apply_to_normalized_components():
    rewards, group_ids = random_batch(3, k=2)
    w1 = relax_gdpo(rewards, group_ids, (1.0, 0.0))
    only_first = relax_gdpo([[r[0], 0.0] for r in rewards], group_ids, (1.0, 1.0))
    torch.testing.assert_close(w1, only_first, rtol=0, atol=1e-6)
