"""The KL estimators (values and gradients) and the loss aggregations against float64 references written
with Python loops, on random log-ratios of both signs, unequal response lengths and an empty row: where
``k3+`` (k3's value, k2's gradient), ``abs`` and Dr. GRPO's constant divisor ``seq_mean_token_sum_norm``
differ from their neighbours."""

from __future__ import annotations

import math

import pytest
import torch

from relax.algorithms import numerics

G = torch.Generator().manual_seed(17)
LOGP = -torch.rand(5, 7, generator=G, dtype=torch.float64) * 3
REF = LOGP - torch.randn(5, 7, generator=G, dtype=torch.float64)  # d = logp - ref, |d| up to ~3
REF[0, 0] = LOGP[0, 0] + 4.0  # d = -4: k3 = e^4 - 5 = 49.6, where low_var_kl's clamp to 10 acts
MASK = torch.arange(7)[None] < torch.tensor([7, 3, 1, 0, 5])[:, None]  # row 3 has no valid token


def _value(kind: str, d: float) -> float:
    if kind == "k1":
        return d
    if kind == "k2":
        return d * d / 2
    if kind == "abs":
        return abs(d)
    k3 = math.exp(-d) - 1 + d
    return max(-10.0, min(10.0, k3)) if kind == "low_var_kl" else k3


def _gradient(kind: str, d: float) -> float:
    """d(estimate)/d(logp): k3+ takes k2's."""
    return {"k1": 1.0, "k2": d, "k3+": d, "abs": math.copysign(1.0, d), "k3": 1 - math.exp(-d)}[kind]


@pytest.mark.parametrize("kind", ["k1", "k2", "k3", "low_var_kl", "k3+", "abs"])
def test_kl_estimators_match_the_float64_loops(kind):
    logp = LOGP.clone().requires_grad_(True)
    got = numerics.kl_estimate(logp, REF, kind)
    for i in range(5):
        for j in range(7):
            d = float(LOGP[i, j] - REF[i, j])
            assert float(got[i, j].detach()) == pytest.approx(_value(kind, d), rel=1e-12, abs=1e-12)
    if kind == "low_var_kl":
        return
    got.sum().backward()
    for i in range(5):
        for j in range(7):
            d = float(LOGP[i, j] - REF[i, j])
            assert float(logp.grad[i, j]) == pytest.approx(_gradient(kind, d), rel=1e-12, abs=1e-12)


def _aggregate_reference(x, mask, mode, max_len, sequences=None) -> float:
    rows = [[float(x[i, j]) for j in range(x.shape[1]) if mask[i, j]] for i in range(x.shape[0])]
    rows = [r for r in rows if r]  # a row without a valid token is no sequence
    count = sequences if sequences is not None else len(rows)
    if mode == "token_mean":
        return sum(map(sum, rows)) / sum(map(len, rows))
    if mode == "seq_mean_token_mean":
        return sum(sum(r) / len(r) for r in rows) / count
    if mode == "seq_mean_token_sum":
        return sum(map(sum, rows)) / count
    return sum(map(sum, rows)) / (count * max_len)  # seq_mean_token_sum_norm: B * L_max, a constant


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"])
def test_aggregations_match_the_float64_loops(mode):
    x = numerics.kl_estimate(LOGP, REF, "k3")
    got = numerics.aggregate(x, MASK, mode, max_response_length=9)
    assert float(got) == pytest.approx(_aggregate_reference(x, MASK, mode, 9), rel=1e-12)
    if mode != "token_mean":  # a mini-batch's sequence count as the divisor (micro-batches add up)
        got = numerics.aggregate(x, MASK, mode, global_num_sequences=10.0, max_response_length=9)
        assert float(got) == pytest.approx(_aggregate_reference(x, MASK, mode, 9, sequences=10), rel=1e-12)


def test_the_constant_divisor_does_not_follow_the_longest_response():
    # the same tokens in a batch whose longest response is 7 and in one cut to 3 columns: Dr. GRPO's
    # divisor is B * L_max either way, seq_mean_token_sum's ratio to it is exactly L_max
    x = numerics.kl_estimate(LOGP, REF, "k1")
    short = MASK[:, :3]
    for mask in (MASK, short):
        width = mask.shape[1]
        norm = numerics.aggregate(x[:, :width], mask, "seq_mean_token_sum_norm", max_response_length=9)
        plain = numerics.aggregate(x[:, :width], mask, "seq_mean_token_sum")
        assert float(plain / norm) == pytest.approx(9.0, rel=1e-12)
