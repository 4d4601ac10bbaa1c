"""The speed paths of the group statistics give the same bits as the plain ones.

``group_standardize`` of ``[N, K]`` switches to a column-by-column evaluation for large N, and
``whiten_segments`` skips its collectives without a process group; neither may change a result.
"""

import pytest
import torch

from relax.algorithms import numerics


def _rewards(n: int, k: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    r = torch.randint(0, 3, (n, k), generator=gen).double() + torch.rand(n, k, generator=gen, dtype=torch.float64)
    r[: n // 4, k - 1] = 0.7  # some groups constant in the last column
    return r


@pytest.mark.parametrize("divide_by_std", [True, False])
def test_columnwise_standardize_is_bit_identical_to_whole_matrix(monkeypatch, divide_by_std):
    n = 2000
    gen = torch.Generator().manual_seed(1)
    ids = (torch.arange(n) // 5)[torch.randperm(n, generator=gen)] * 3 - 7  # shuffled, negative, gaps
    r = _rewards(n, 3, seed=2)
    monkeypatch.setattr(numerics.groups, "_COLUMNWISE_MIN_SAMPLES", 10**9)
    whole = numerics.group_standardize(r, ids, 1e-4, divide_by_std=divide_by_std)
    monkeypatch.setattr(numerics.groups, "_COLUMNWISE_MIN_SAMPLES", 1)
    columnwise = numerics.group_standardize(r, ids, 1e-4, divide_by_std=divide_by_std)
    assert torch.equal(columnwise, whole)
    assert columnwise.is_contiguous() and columnwise.shape == r.shape
    # and each column is its own 1-D standardization
    for k in range(3):
        assert torch.equal(columnwise[:, k], numerics.group_standardize(r[:, k].contiguous(), ids, 1e-4,
                                                                 divide_by_std=divide_by_std))


def test_columnwise_standardize_leaves_input_alone(monkeypatch):
    monkeypatch.setattr(numerics.groups, "_COLUMNWISE_MIN_SAMPLES", 1)
    for shape in [(1, 1), (6, 1), (1, 3), (6, 3)]:
        r = _rewards(*shape, seed=3)
        before = r.clone()
        numerics.group_standardize(r, torch.arange(shape[0]) // 2, 1e-4)
        assert torch.equal(r, before)


def test_first_member_is_the_smallest_position_and_zero_for_unused_rows():
    ids = torch.tensor([5, 2, 5, 0, 2, 5])
    first = numerics.Groups(ids).first_member()  # dense ids: rows 0..5, rows 1, 3, 4 unused
    assert first.tolist() == [3, 0, 1, 0, 0, 0]
