"""PolicyLossOutput's contract: metrics are additive shares like the loss.

A batch split into two halves, each normalized by the whole batch's global token / sequence
counts, must give metrics whose sum is the whole batch's metrics (computed without global
divisors). M2PO's per-batch scalars are weighted by the half's share of the valid tokens, so their
sum is the token-weighted mean of the halves' own values.
"""

import pytest
import torch

from relax.algorithms import PolicyLossInputs, get_algorithm

MODES = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum")
# Rows of different lengths (3, 5, 1, 4 valid tokens), so halves hold unequal token shares.
MASK = torch.tensor([
    [1, 1, 1, 0, 0],
    [1, 1, 1, 1, 1],
    [1, 0, 0, 0, 0],
    [1, 1, 1, 1, 0],
], dtype=torch.bool)
HALVES = (slice(0, 2), slice(2, 4))


def _tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    log_probs = -torch.rand(MASK.shape, generator=g) * 3 - 0.1
    delta = (torch.rand(MASK.shape, generator=g) - 0.5) * 1.2  # |log ratio| up to 0.6: clips at eps 0.2
    advantages = torch.tensor([[1.5], [-0.7], [2.0], [-1.2]]).expand(MASK.shape).clone()
    return {
        "log_probs": log_probs,
        "old_log_probs": log_probs - delta,
        "advantages": advantages,
        "ref_log_probs": log_probs + (torch.rand(MASK.shape, generator=g) - 0.5) * 0.4,
        "entropy": torch.rand(MASK.shape, generator=g) * 2,
    }


def _inputs(rows: slice, *, global_counts: bool) -> PolicyLossInputs:
    t = {k: v[rows] for k, v in _tensors().items()}
    mask = MASK[rows]
    kw = {}
    if global_counts:
        kw = {"global_num_tokens": float(MASK.sum()), "global_num_sequences": float(MASK.shape[0])}
    return PolicyLossInputs(response_mask=mask, **t, **kw)


def _make(name: str, **config):
    if name == "gdpo":
        config.setdefault("reward_keys", ("a", "b"))
    cls = get_algorithm(name)
    return cls(cls.Config(**config))


def _metrics(algorithm, rows: slice, *, global_counts: bool) -> dict[str, float]:
    out = algorithm.policy_loss(_inputs(rows, global_counts=global_counts))
    metrics = {k: float(v) for k, v in out.metrics.items()}
    metrics["__loss"] = float(out.loss)
    return metrics


def _halves_sum(algorithm) -> dict[str, float]:
    parts = [_metrics(algorithm, rows, global_counts=True) for rows in HALVES]
    assert parts[0].keys() == parts[1].keys()
    return {k: parts[0][k] + parts[1][k] for k in parts[0]}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["grpo", "gspo", "sapo", "cispo", "gdpo"])
def test_split_batch_metrics_sum_to_the_whole_batch(name, mode):
    config = {"loss_aggregation": mode, "use_kl_loss": True, "kl_loss_coef": 0.1, "entropy_coef": 0.01}
    if name != "cispo":
        config["eps_clip_c"] = 1.5
    algorithm = _make(name, **config)
    whole = _metrics(algorithm, slice(0, 4), global_counts=False)
    summed = _halves_sum(algorithm)
    expected_keys = {"__loss", "pg_loss", "ppo_kl", "pg_clipfrac", "entropy", "kl_loss"}
    assert expected_keys <= whole.keys()
    assert summed.keys() == whole.keys()
    if name in ("grpo", "gdpo") and mode == "token_mean":
        # The inputs must exercise the clip: a fraction strictly between 0 and 1.
        assert 0.0 < whole["pg_clipfrac"] < 1.0
        assert "dual_clipfrac" in whole
    for key, value in whole.items():
        assert summed[key] == pytest.approx(value, rel=1e-6, abs=1e-7), key


def test_averaging_the_halves_would_not_give_the_whole_batch():
    # The reason for the contract: with unequal token counts per half, the halves' own (locally
    # normalized) clip fractions do not average to the whole batch's.
    algorithm = _make("grpo")
    whole = _metrics(algorithm, slice(0, 4), global_counts=False)["pg_clipfrac"]
    local = [_metrics(algorithm, rows, global_counts=False)["pg_clipfrac"] for rows in HALVES]
    assert sum(local) / 2 != pytest.approx(whole, rel=1e-3)


def test_m2po_scalars_are_token_weighted_shares():
    # Budget 0.01 with |log ratio| up to 0.6: the trust region is active, so each half has its own
    # M2 and clip range. Their shares must be the half's own value times its share of the tokens.
    algorithm = _make("m2po", m2po_kl2_budget=0.01, m2po_miniclip_low=0.0, m2po_miniclip_high=0.0)
    total = float(MASK.sum())
    own = [_metrics(algorithm, rows, global_counts=False) for rows in HALVES]
    shares = [_metrics(algorithm, rows, global_counts=True) for rows in HALVES]
    weights = [float(MASK[rows].sum()) / total for rows in HALVES]
    assert weights == [8 / 13, 5 / 13]
    assert own[0]["m2_before"] != pytest.approx(own[1]["m2_before"], rel=1e-3)  # halves really differ
    for key in ("m2_before", "m2_after", "eps_low", "eps_high"):
        for o, s, w in zip(own, shares, weights):
            assert s[key] == pytest.approx(o[key] * w, rel=1e-6), key
        token_weighted_mean = sum(o[key] * w for o, w in zip(own, weights))
        assert shares[0][key] + shares[1][key] == pytest.approx(token_weighted_mean, rel=1e-6), key


def test_m2po_split_batch_sums_to_the_whole_batch_when_the_trust_region_is_inactive():
    # With a budget no batch reaches, the clip range is the same constant on both halves and the
    # whole batch, so every metric but M2 itself must add up to the whole batch's value (eps_low = 1
    # on each: unweighted, the halves would sum to 2). M2 is a per-micro-batch statistic over the
    # "harmful" tokens: its share-sum is the token-weighted mean tested above, not the whole's M2.
    algorithm = _make("m2po", m2po_kl2_budget=10.0, use_kl_loss=True, kl_loss_coef=0.1)
    whole = _metrics(algorithm, slice(0, 4), global_counts=False)
    summed = _halves_sum(algorithm)
    assert whole["eps_low"] == 1.0
    assert summed.keys() == whole.keys()
    for key, value in whole.items():
        if key in ("m2_before", "m2_after"):
            continue
        assert summed[key] == pytest.approx(value, rel=1e-6, abs=1e-7), key


def test_m2po_scalars_unchanged_when_this_batch_is_the_whole_batch():
    # global_num_tokens equal to the local count: a share of exactly 1, bit for bit.
    algorithm = _make("m2po", m2po_kl2_budget=0.01)
    plain = algorithm.policy_loss(_inputs(slice(0, 4), global_counts=False)).metrics
    shared = algorithm.policy_loss(_inputs(slice(0, 4), global_counts=True)).metrics
    for key in ("m2_before", "m2_after", "eps_low", "eps_high"):
        assert torch.equal(plain[key], shared[key]), key
