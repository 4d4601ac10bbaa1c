"""Property tests (hypothesis): group centring, permutation equivariance, whitening moments."""

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from relax.algorithms import AdvantageInputs, get_algorithm
from relax.algorithms import numerics

SETTINGS = settings(max_examples=25, deadline=None, derandomize=True)
# A small value set makes constant groups and ties frequent; the float range exercises the rest.
VALUES = st.one_of(st.sampled_from([0.0, 0.5, 1.0, 0.1]), st.floats(-100, 100, allow_nan=False, width=32))


@st.composite
def grouped_batches(draw, k=1, min_group=2):
    n_groups = draw(st.integers(1, 5))
    size = draw(st.integers(min_group, 5))
    ids = draw(st.lists(st.integers(0, 10**6), min_size=n_groups, max_size=n_groups, unique=True))
    group_ids = [g for g in ids for _ in range(size)]
    perm = draw(st.permutations(range(len(group_ids))))
    group_ids = [group_ids[i] for i in perm]
    rewards = draw(st.lists(st.lists(VALUES, min_size=k, max_size=k), min_size=len(group_ids),
                            max_size=len(group_ids)))
    return torch.tensor(rewards, dtype=torch.float32), torch.tensor(group_ids), size


def _make(name, size, k=1, **cfg):
    keys = tuple(f"r{i}" for i in range(k))
    cls = get_algorithm(name)
    return cls(cls.Config(reward_keys=keys, n_samples_per_prompt=size, **cfg))


def _group_means(out, group_ids):
    return {int(g): out[group_ids == g].double().mean().item() for g in group_ids.unique()}


@SETTINGS
@given(batch=grouped_batches(), name=st.sampled_from(["grpo", "rloo", "reinforce_plus_plus_baseline"]),
       std=st.booleans())
def test_group_normalized_outputs_have_zero_group_mean(batch, name, std):
    rewards, group_ids, size = batch
    cfg = {"grpo_std_normalization": std} if name == "grpo" else {}
    if name == "reinforce_plus_plus_baseline":
        cfg["normalize_advantages"] = True
    out = _make(name, size, **cfg).normalize_rewards(rewards[:, 0], group_ids)
    assert torch.isfinite(out).all()
    scale = max(1.0, rewards.abs().max().item())
    for g, m in _group_means(out, group_ids).items():
        assert abs(m) <= 1e-6 * scale, (g, m)


@SETTINGS
@given(batch=grouped_batches(k=2))
def test_gdpo_outputs_have_zero_group_mean_and_constant_groups_are_exactly_zero(batch):
    rewards, group_ids, size = batch
    out = _make("gdpo", size, k=2).normalize_rewards(rewards, group_ids)
    for g, m in _group_means(out, group_ids).items():
        assert abs(m) <= 1e-5, (g, m)
        members = group_ids == g
        if bool((rewards[members] == rewards[members][0]).all()):
            assert out[members].eq(0).all()


@SETTINGS
@given(batch=grouped_batches(k=2), name=st.sampled_from(["grpo", "gdpo", "rloo", "reinforce_plus_plus_baseline"]),
       seed=st.integers(0, 2**31))
def test_permuting_samples_permutes_outputs(batch, name, seed):
    rewards, group_ids, size = batch
    cfg = {"normalize_advantages": True} if name == "reinforce_plus_plus_baseline" else {}
    algo = _make(name, size, k=2, **cfg)
    perm = torch.randperm(len(group_ids), generator=torch.Generator().manual_seed(seed))
    out = algo.normalize_rewards(rewards, group_ids)
    out_perm = algo.normalize_rewards(rewards[perm], group_ids[perm])
    torch.testing.assert_close(out_perm, out[perm], rtol=1e-6, atol=1e-6)


@SETTINGS
@given(values=st.lists(VALUES, min_size=1, max_size=30), cut=st.integers(0, 30))
def test_whitening_has_zero_mean_unit_std_unless_collapsed(values, cut):
    x = torch.tensor(values, dtype=torch.float32)
    cut = min(cut, len(values))
    sizes = (cut, len(values) - cut)
    out = numerics.whiten_segments(x, sizes)
    start = 0
    for s in sizes:
        seg, o = x[start:start + s].double(), out[start:start + s].double()
        start += s
        if s == 0:
            continue
        if bool((seg == seg[0]).all()):
            assert o.eq(0).all()
            continue
        std = seg.std().item()
        assert abs(o.mean().item()) <= 1e-6
        # (x - mean) / (std + 1e-4) has std exactly std / (std + 1e-4)
        assert math.isclose(o.std().item(), std / (std + 1e-4), rel_tol=1e-5)


@SETTINGS
@given(values=st.lists(VALUES, min_size=2, max_size=12), lengths=st.lists(st.integers(1, 4), min_size=12,
                                                                               max_size=12))
def test_gdpo_advantages_are_the_whitened_rewards_on_every_valid_token(values, lengths):
    n = len(values)
    mask = torch.arange(4)[None, :] < torch.tensor(lengths[:n])[:, None]
    x = torch.tensor(values, dtype=torch.float32)
    algo = _make("gdpo", 2, k=2)
    adv, ret = algo.compute_advantages(AdvantageInputs(rewards=x, response_mask=mask))
    expected = numerics.whiten_segments(x)
    assert torch.equal(adv, torch.where(mask, expected[:, None], torch.zeros(())))
    assert torch.equal(ret, adv)
