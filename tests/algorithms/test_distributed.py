"""Two-process gloo tests of every distributed batch statistic.

One spawn of two ranks runs all checks (``_algorithms_dist_checks.ORDER``) over an explicit process
group; the tests below compare each rank's result with (1) the single-process result on the
concatenated batch and (2) a plain-Python formula. Malformed input on ONE rank must make BOTH ranks
raise; a hang fails the test through the join timeout (and the gloo timeout inside the ranks).
"""

import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _algorithms_dist_checks as checks  # noqa: E402  (spawned children import it by this name)
from spawned_ranks import spawn_ranks  # noqa: E402

from relax.algorithms import (
    AdvantageInputs,  # noqa: E402
    numerics,  # noqa: E402
)

pytestmark = pytest.mark.timeout(120)
GLOO_TIMEOUT_S = 30
JOIN_TIMEOUT_S = 90


@pytest.fixture(scope="module")
def results():
    out, exit_codes = spawn_ranks(checks.run_rank, checks.WORLD, GLOO_TIMEOUT_S, join_timeout_s=JOIN_TIMEOUT_S)
    for rank in range(checks.WORLD):
        assert list(out[rank]) == checks.ORDER
    assert exit_codes == [0, 0]
    return out


def ok(results, name):
    per_rank = []
    for rank in range(checks.WORLD):
        status, *value = results[rank][name]
        assert status == "ok", (name, rank, value)
        per_rank.append(value[0])
    return per_rank


def close(got, expected, rtol=1e-6, atol=1e-6):
    torch.testing.assert_close(torch.tensor(got, dtype=torch.float64), torch.as_tensor(expected, dtype=torch.float64),
                               rtol=rtol, atol=atol)


# -- plain-Python references --


def py_mean_std(xs):
    m = sum(xs) / len(xs)
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def py_whiten(xs, eps=1e-4):
    if not xs or max(xs) == min(xs):
        return [0.0] * len(xs)
    m, s = py_mean_std(xs)
    return [(x - m) / (s + eps) for x in xs]


def split_segments(x, sizes):
    out, start = [], 0
    for s in sizes:
        out.append(x[start:start + s])
        start += s
    return out


def segment_reference(shards):
    """Whiten segment j of every rank jointly; return per-rank outputs."""
    segs = [split_segments(x.double().tolist(), sizes) for x, sizes in shards]
    per_rank = [[] for _ in shards]
    for j in range(len(shards[0][1])):
        joint = py_whiten([v for rank_segs in segs for v in rank_segs[j]])
        start = 0
        for r, rank_segs in enumerate(segs):
            n = len(rank_segs[j])
            per_rank[r] += joint[start:start + n]
            start += n
    return per_rank


def token_values(shard_list, key):
    return [v for s in shard_list for v in s[key][s["mask"]].double().tolist()]


def normalize_tokens(shard_list, per_row_values, unbiased):
    """Per-rank [N, T] outputs of token whitening (unbiased: masked_whiten; else REINFORCE++)."""
    flat = [v for rank_rows in per_row_values for row in rank_rows for v in row]
    m = sum(flat) / len(flat)
    ss = sum((v - m) ** 2 for v in flat)
    scale = 1 / math.sqrt(ss / (len(flat) - 1) + 1e-8) if unbiased else max(ss / len(flat), 1e-8) ** -0.5
    outs = []
    for s, rank_rows in zip(shard_list, per_row_values):
        out = torch.zeros(s["mask"].shape, dtype=torch.float64)
        for i, row in enumerate(rank_rows):
            out[i, : len(row)] = torch.tensor([(v - m) * scale for v in row], dtype=torch.float64)
        outs.append(out)
    return outs


def rows_of(s, key):
    return [s[key][i][s["mask"][i]].double().tolist() for i in range(s["mask"].shape[0])]


# -- batch statistics --


def test_weighted_whitening_over_uneven_shards(results):
    # Weight 0/1: the statistics are the mean and unbiased std of the counted samples of both ranks;
    # every sample, counted or not, is whitened with them.
    got = ok(results, "_whiten_weighted")
    shards = checks.per_sample_shards()
    valid = [v for x, _ in shards for v in x[x > 0].double().tolist()]
    m, s = py_mean_std(valid)
    for rank_result, (x, _) in zip(got, shards):
        close(rank_result, [(v - m) / (s + 1e-4) for v in x.double().tolist()], rtol=1e-6, atol=1e-6)
    # single process on the concatenated batch
    x = torch.cat([x for x, _ in shards])
    single = numerics.whiten_segments_weighted(x, (x > 0).to(torch.float32)).tolist()
    close(got[0] + got[1], single, rtol=3e-7, atol=1e-9)


def test_weighted_whitening_with_an_empty_shard(results):
    got = ok(results, "_whiten_weighted_empty_shard")
    x0 = checks.per_sample_shards()[0][0].double().tolist()
    m, s = py_mean_std(x0)
    close(got[0], [(v - m) / (s + 1e-4) for v in x0])
    assert got[1] == []


def test_whiten_segments_uneven_shards_several_segments(results):
    got = ok(results, "_whiten_segments")
    shards = checks.per_sample_shards()
    expected = segment_reference(shards)
    for r in range(2):
        close(got[r], expected[r])
    # equals one process whitening the concatenation of each segment
    for j in range(3):
        parts = [split_segments(x, sizes)[j] for x, sizes in shards]
        single = numerics.whiten_segments(torch.cat(parts)).tolist()
        from_ranks = split_segments(got[0], shards[0][1])[j] + split_segments(got[1], shards[1][1])[j]
        close(from_ranks, single, rtol=3e-7, atol=1e-9)


def test_whiten_segments_with_an_empty_shard(results):
    got = ok(results, "_whiten_segments_empty_shard")
    x0, sizes = checks.per_sample_shards()[0]
    expected = [v for seg in split_segments(x0.double().tolist(), sizes) for v in py_whiten(seg)]
    close(got[0], expected)
    assert got[1] == []


def test_collapse_is_decided_globally(results):
    got = ok(results, "_whiten_collapse_global_vs_local")
    c = 1 / (math.sqrt(3) + 1e-4)  # segment 1 is {2, 2, 5}: mean 3, std sqrt(3)
    assert got[0][:2] == [0.0, 0.0] and got[1][0] == 0.0
    close(got[0][2:] + got[1][1:], [-c, -c, 2 * c])


def test_weighted_collapse_is_decided_globally_over_positive_weights(results):
    got = ok(results, "_whiten_weighted_collapse_global")
    c = 1 / (math.sqrt(3) + 1e-4)  # segment 1 is {2, 2, 5}: mean 3, std sqrt(3)
    assert got[0][:2] == [0.0, 0.0] and got[1][0] == 0.0
    close(got[0][2:] + got[1][1:], [-c, -c, 2 * c])


def test_masked_whiten_over_shards_with_different_lengths(results):
    got = ok(results, "_masked_whiten")
    shards = checks.token_shards()
    expected = normalize_tokens(shards, [rows_of(s, "per_token") for s in shards], unbiased=True)
    for r in range(2):
        close(got[r], expected[r])


def test_token_global_normalize_over_shards(results):
    got = ok(results, "_token_global_normalize")
    shards = checks.token_shards()
    expected = normalize_tokens(shards, [rows_of(s, "per_token") for s in shards], unbiased=False)
    for r in range(2):
        close(got[r], expected[r])


def test_token_global_normalize_with_an_empty_shard(results):
    got = ok(results, "_token_global_normalize_empty_shard")
    s0 = checks.token_shards()[0]
    expected = normalize_tokens([s0], [rows_of(s0, "per_token")], unbiased=False)[0]
    close(got[0], expected)
    assert got[1] == []


def test_check_finite_passes_on_finite_input_with_nan_padding(results):
    assert ok(results, "_check_finite_ok") == ["ok", "ok"]


# -- algorithms with a process group --


def test_gdpo_compute_advantages_matches_single_process(results):
    got = ok(results, "_gdpo")
    shards = checks.per_sample_shards()
    expected = segment_reference(shards)
    for r, (x, sizes) in enumerate(shards):
        mask = torch.ones(x.shape[0], 2, dtype=torch.bool)
        mask[::2, 1] = False
        exp = torch.tensor(expected[r], dtype=torch.float64)[:, None] * mask
        close(got[r][0], exp)
        assert got[r][1] == got[r][0]


def test_gdpo_with_an_empty_shard(results):
    got = ok(results, "_gdpo_empty_shard")
    x0, sizes = checks.per_sample_shards()[0]
    single, _ = checks.algorithm("gdpo").compute_advantages(
        AdvantageInputs(rewards=x0, response_mask=torch.ones(9, 2, dtype=torch.bool), segment_sizes=sizes)
    )
    assert torch.equal(torch.tensor(got[0]), single)
    assert got[1] == []


def _discounted_rows(s, kl_coef, gamma):
    rows = []
    for i in range(s["mask"].shape[0]):
        n = int(s["mask"][i].sum())
        kl = s["kl"][i].double().tolist()
        r = [-kl_coef * kl[t] + (s["rewards"][i].item() if t == n - 1 else 0.0) for t in range(n)]
        acc, ret = 0.0, [0.0] * n
        for t in reversed(range(n)):
            acc = r[t] + gamma * acc
            ret[t] = acc
        rows.append(ret)
    return rows


def _single_process(name, shard_list, **cfg):
    """The same algorithm on the concatenated (re-padded) batch, process_group=None."""
    t_len = max(s["mask"].shape[1] for s in shard_list)

    def pad(t, value):
        return torch.nn.functional.pad(t, (0, t_len - t.shape[1]), value=value)

    mask = torch.cat([pad(s["mask"], False) for s in shard_list])
    kw = {"kl": torch.cat([pad(s["kl"], float("nan")) for s in shard_list])} if name == "reinforce_plus_plus" else {}
    adv, _ = checks.algorithm(name, **cfg).compute_advantages(
        AdvantageInputs(rewards=torch.cat([s["rewards"] for s in shard_list]), response_mask=mask, **kw)
    )
    out, start = [], 0
    for s in shard_list:
        n, t = s["mask"].shape
        out.append(adv[start:start + n, :t])
        start += n
    return out


def test_reinforce_plus_plus_matches_single_process(results):
    got = ok(results, "_reinforce_pp")
    shards = checks.token_shards()
    expected = normalize_tokens(shards, [_discounted_rows(s, 0.1, 0.9) for s in shards], unbiased=False)
    single = _single_process("reinforce_plus_plus", shards, kl_coef=0.1, gamma=0.9)
    for r in range(2):
        close(got[r][0], expected[r])
        close(got[r][0], single[r], rtol=3e-7, atol=1e-7)


def test_reinforce_plus_plus_with_an_empty_shard(results):
    got = ok(results, "_reinforce_pp_empty_shard")
    s0 = checks.token_shards()[0]
    expected = normalize_tokens([s0], [_discounted_rows(s0, 0.1, 0.9)], unbiased=False)[0]
    close(got[0][0], expected)
    assert got[1][0] == []


def test_reinforce_plus_plus_baseline_matches_single_process(results):
    got = ok(results, "_reinforce_pp_baseline")
    shards = checks.token_shards()
    per_rows = [[[s["rewards"][i].item()] * int(s["mask"][i].sum()) for i in range(s["mask"].shape[0])]
                for s in shards]
    expected = normalize_tokens(shards, per_rows, unbiased=False)
    single = _single_process("reinforce_plus_plus_baseline", shards)
    for r in range(2):
        close(got[r][0], expected[r])
        close(got[r][0], single[r], rtol=3e-7, atol=1e-7)


def test_grpo_normalize_advantages_matches_single_process(results):
    got = ok(results, "_grpo_whitened")
    shards = checks.token_shards()
    per_rows = [[[s["rewards"][i].item()] * int(s["mask"][i].sum()) for i in range(s["mask"].shape[0])]
                for s in shards]
    expected = normalize_tokens(shards, per_rows, unbiased=True)
    single = _single_process("grpo", shards)
    for r in range(2):
        close(got[r][0], expected[r])
        close(got[r][0], single[r], rtol=3e-7, atol=1e-7)


# -- malformed input on one rank: both ranks raise, nobody hangs --


@pytest.mark.parametrize(
    "name, bad_rank, bad_match, other_match",
    [
        ("_bad_non_finite_whiten", 0, "non-finite", "another rank"),
        ("_bad_segment_count", None, "segment", "segment"),
        ("_bad_segment_sum", 1, "sum to 5", "another rank"),
        ("_bad_weighted_negative_weight", 0, "weights must be finite and >= 0", "another rank"),
        ("_bad_gdpo_inf_reward", 1, "non-finite", "another rank"),
        ("_bad_token_normalize_nan", 1, "non-finite", "another rank"),
        ("_bad_reinforce_pp_nan_kl", 0, "non-finite", "another rank"),
        ("_bad_no_valid_token_anywhere", None, "no valid response token", "no valid response token"),
        ("_bad_check_finite", 0, "non-finite", "another rank"),
    ],
)
def test_malformed_input_on_one_rank_raises_on_both(results, name, bad_rank, bad_match, other_match):
    for rank in range(checks.WORLD):
        status, *info = results[rank][name]
        assert status == "error", (name, rank, info)
        exc_type, message = info
        assert exc_type == "ValueError", (name, rank, info)
        assert (bad_match if rank == bad_rank or bad_rank is None else other_match) in message, (name, rank, message)


def test_group_still_in_sync_after_the_errors(results):
    # every rank ran the same collectives through the error paths: a final all-reduce still pairs up
    assert ok(results, "_still_in_sync") == [3.0, 3.0]


def test_off_policy_weight_metrics_cover_every_ranks_units(results):
    # quantiles are no shares: every rank gathers all units and logs the whole step's numbers, equal
    # to one process holding the concatenated units
    from relax.runtime.metrics.actor_metrics import off_policy_weight_metrics

    got = ok(results, "_off_policy_weight_metrics")
    assert got[0] == got[1]
    units = [numerics.unit_log_weights(s["old_log_probs"], s["fields"]["rollout_log_probs"], s["batch"].response_mask,
                                       "seq_tis") for s in (checks.off_policy_shard(0), checks.off_policy_shard(1))]
    assert [u.numel() for u in units] == [3, 2]
    single = numerics.weight_statistics(torch.cat(units), "seq_tis", 1.2)
    assert got[0] == {f"off_policy/{k}": pytest.approx(v, rel=1e-12) for k, v in single.items()}
    one_rank = off_policy_weight_metrics(checks.off_policy_shard(0), checks.AlgorithmConfig(
        off_policy_correction="seq_tis", off_policy_cap=1.2))
    assert one_rank != got[0]  # rank 0 alone would log other numbers


def test_off_policy_weight_metrics_with_an_empty_shard(results):
    got = ok(results, "_off_policy_weight_metrics_empty_shard")
    assert got[0] == got[1] and got[0]["off_policy/weight_max"] > 0
    shard = checks.off_policy_shard(0)
    tokens = numerics.unit_log_weights(shard["old_log_probs"], shard["fields"]["rollout_log_probs"],
                                       shard["batch"].response_mask, "tis")
    single = numerics.weight_statistics(tokens, "tis", 1.2)
    assert got[1] == {f"off_policy/{k}": pytest.approx(v, rel=1e-12) for k, v in single.items()}
