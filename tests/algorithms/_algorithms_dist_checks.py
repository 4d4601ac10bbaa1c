"""Worker side of test_distributed.py: runs in each spawned gloo rank.

Kept in its own module (imported by a plain name, not collected by pytest) so that
``multiprocessing`` spawn children can import the worker function and the shared fixtures. Every
check returns plain Python lists (no tensors cross the process boundary).
"""

from __future__ import annotations

import datetime
import os
import traceback

import torch
import torch.distributed as dist

from relax.algorithms import AdvantageInputs, AlgorithmConfig, get_algorithm, numerics

WORLD = 2
NAN = float("nan")


# -- shard fixtures shared by the ranks and by the single-process reference in the parent --


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def per_sample_shards():
    """Uneven per-sample shards and their segment sizes (3 segments; one segment empty on rank 1)."""
    g = _gen(0)
    x0 = torch.randn(9, generator=g) * 3 + 1
    x1 = torch.randn(6, generator=g) * 3 + 1
    return [(x0, (3, 2, 4)), (x1, (1, 0, 5))]


def token_shards():
    """Uneven [N, T] shards with different T per rank; padding holds NaN."""
    g = _gen(1)
    out = []
    for n, t_len, lengths in ((3, 4, [4, 1, 2]), (2, 6, [6, 3])):
        mask = torch.arange(t_len)[None, :] < torch.tensor(lengths)[:, None]
        rewards = torch.randn(n, generator=g)
        values = torch.randn(n, t_len, generator=g)
        kl = torch.randn(n, t_len, generator=g) * 0.1
        per_token = torch.randn(n, t_len, generator=g) * 2 + 0.5
        for t in (values, kl, per_token):
            t[~mask] = NAN
        out.append(dict(mask=mask, rewards=rewards, values=values, kl=kl, per_token=per_token))
    return out


def empty_token_shard(t_len=3):
    return dict(mask=torch.zeros(0, t_len, dtype=torch.bool), rewards=torch.zeros(0),
                values=torch.zeros(0, t_len), kl=torch.zeros(0, t_len), per_token=torch.zeros(0, t_len))


def algorithm(name, **cfg):
    if name == "gdpo":
        cfg.setdefault("reward_keys", ("a", "b"))
    if name.startswith("reinforce") or name == "grpo":
        cfg.setdefault("normalize_advantages", True)
    return get_algorithm(name)(AlgorithmConfig(**cfg))


# -- checks: each gets (rank, group) and returns a JSON-like result --


def _whiten_weighted(rank, pg):
    x, _ = per_sample_shards()[rank]
    weights = (x > 0).to(torch.float32)  # a data-dependent, uneven number of counted samples
    return numerics.whiten_segments_weighted(x, weights, None, pg).tolist()


def _whiten_weighted_empty_shard(rank, pg):
    x = per_sample_shards()[0][0] if rank == 0 else torch.zeros(0)
    return numerics.whiten_segments_weighted(x, torch.ones_like(x), None, pg).tolist()


def _whiten_segments(rank, pg):
    x, sizes = per_sample_shards()[rank]
    return numerics.whiten_segments(x, sizes, pg).tolist()


def _whiten_segments_empty_shard(rank, pg):
    x, sizes = per_sample_shards()[0]
    if rank == 1:
        x, sizes = torch.zeros(0), (0, 0, 0)
    return numerics.whiten_segments(x, sizes, pg).tolist()


def _whiten_collapse_global_vs_local(rank, pg):
    # segment 0: 1.5 on both ranks -> collapsed globally -> zeros
    # segment 1: constant on each rank (2.0 / 5.0), but not globally -> real whitening
    x = torch.tensor([1.5, 1.5, 2.0, 2.0]) if rank == 0 else torch.tensor([1.5, 5.0])
    sizes = (2, 2) if rank == 0 else (1, 1)
    return numerics.whiten_segments(x, sizes, pg).tolist()


def _whiten_weighted_collapse_global(rank, pg):
    # segment 0: every positive-weight value is 1.5 on both ranks (9.0 has weight 0) -> zeros
    # segment 1: constant on each rank (2.0 / 5.0), but not globally -> real whitening
    x = torch.tensor([1.5, 9.0, 2.0, 2.0]) if rank == 0 else torch.tensor([1.5, 5.0])
    w = torch.tensor([1.0, 0.0, 1.0, 1.0]) if rank == 0 else torch.tensor([2.0, 1.0])
    sizes = (2, 2) if rank == 0 else (1, 1)
    return numerics.whiten_segments_weighted(x, w, sizes, pg).tolist()


def _masked_whiten(rank, pg):
    s = token_shards()[rank]
    return numerics.masked_whiten(s["per_token"], s["mask"], pg).tolist()


def _token_global_normalize(rank, pg):
    s = token_shards()[rank]
    return numerics.token_global_normalize(s["per_token"], s["mask"], pg).tolist()


def _token_global_normalize_empty_shard(rank, pg):
    s = token_shards()[0] if rank == 0 else empty_token_shard(4)
    return numerics.token_global_normalize(s["per_token"], s["mask"], pg).tolist()


def _check_finite_ok(rank, pg):
    s = token_shards()[rank]
    numerics.check_finite(s["per_token"], s["mask"], pg, what="test values")
    return "ok"


def _gdpo(rank, pg):
    x, sizes = per_sample_shards()[rank]
    mask = torch.ones(x.shape[0], 2, dtype=torch.bool)
    mask[::2, 1] = False
    adv, ret = algorithm("gdpo").compute_advantages(
        AdvantageInputs(rewards=x, response_mask=mask, segment_sizes=sizes), pg
    )
    return [adv.tolist(), ret.tolist()]


def _gdpo_empty_shard(rank, pg):
    x, sizes = per_sample_shards()[0]
    if rank == 1:
        x, sizes = torch.zeros(0), (0, 0, 0)
    mask = torch.ones(x.shape[0], 2, dtype=torch.bool)
    adv, _ = algorithm("gdpo").compute_advantages(
        AdvantageInputs(rewards=x, response_mask=mask, segment_sizes=sizes), pg
    )
    return adv.tolist()


def _token_algorithm(name, shard, pg, **cfg):
    s = shard
    kw = {"kl": s["kl"]} if name == "reinforce_plus_plus" else {}
    if name == "ppo":
        kw["values"] = s["values"]
    adv, ret = algorithm(name, **cfg).compute_advantages(
        AdvantageInputs(rewards=s["rewards"], response_mask=s["mask"], **kw), pg
    )
    return [adv.tolist(), ret.tolist()]


def _reinforce_pp(rank, pg):
    return _token_algorithm("reinforce_plus_plus", token_shards()[rank], pg, kl_coef=0.1, gamma=0.9)


def _reinforce_pp_empty_shard(rank, pg):
    shard = token_shards()[0] if rank == 0 else empty_token_shard(4)
    return _token_algorithm("reinforce_plus_plus", shard, pg, kl_coef=0.1, gamma=0.9)


def _reinforce_pp_baseline(rank, pg):
    return _token_algorithm("reinforce_plus_plus_baseline", token_shards()[rank], pg)


def _grpo_whitened(rank, pg):
    return _token_algorithm("grpo", token_shards()[rank], pg)


def off_policy_shard(rank):
    """An actor shard for ``off_policy_weight_metrics``: old and engine log-probs of different widths
    per rank; rank 1 of the empty variant holds no rows."""
    g = _gen(20 + rank)
    n, t = (3, 4) if rank == 0 else (2, 6)
    mask = torch.arange(t)[None, :] < torch.randint(1, t + 1, (n,), generator=g)[:, None]
    engine = -torch.rand(n, t, generator=g) * 2
    old = engine + torch.randn(n, t, generator=g) * 0.3

    class Batch:
        response_mask = mask

    return {"batch": Batch(), "old_log_probs": old, "fields": {"rollout_log_probs": engine}}


def _off_policy_weight_metrics(rank, pg):
    from relax.runtime.metrics.actor_metrics import off_policy_weight_metrics

    config = AlgorithmConfig(off_policy_correction="seq_tis", off_policy_cap=1.2)
    return off_policy_weight_metrics(off_policy_shard(rank), config, pg)


def _off_policy_weight_metrics_empty_shard(rank, pg):
    from relax.runtime.metrics.actor_metrics import off_policy_weight_metrics

    shard = off_policy_shard(0) if rank == 0 else {"batch": None, "fields": {}}
    return off_policy_weight_metrics(shard, AlgorithmConfig(off_policy_correction="tis", off_policy_cap=1.2), pg)


# -- malformed input on ONE rank: every rank must raise, nobody may hang --


def _bad_non_finite_whiten(rank, pg):
    x, sizes = per_sample_shards()[rank]
    if rank == 0:
        x = x.clone()
        x[4] = NAN
    return numerics.whiten_segments(x, sizes, pg).tolist()


def _bad_segment_count(rank, pg):
    x, _ = per_sample_shards()[rank]
    sizes = (4, 5) if rank == 0 else (2, 2, 2)
    return numerics.whiten_segments(x, sizes, pg).tolist()


def _bad_segment_sum(rank, pg):
    x, sizes = per_sample_shards()[rank]
    if rank == 1:
        sizes = (1, 0, 4)  # sums to 5, the shard holds 6
    return numerics.whiten_segments(x, sizes, pg).tolist()


def _bad_weighted_negative_weight(rank, pg):
    x, sizes = per_sample_shards()[rank]
    w = torch.ones_like(x)
    if rank == 0:
        w[1] = -1.0
    return numerics.whiten_segments_weighted(x, w, sizes, pg).tolist()


def _bad_gdpo_inf_reward(rank, pg):
    x, sizes = per_sample_shards()[rank]
    if rank == 1:
        x = x.clone()
        x[0] = float("inf")
    mask = torch.ones(x.shape[0], 1, dtype=torch.bool)
    return algorithm("gdpo").compute_advantages(
        AdvantageInputs(rewards=x, response_mask=mask, segment_sizes=sizes), pg
    )[0].tolist()


def _bad_token_normalize_nan(rank, pg):
    s = token_shards()[rank]
    per_token = s["per_token"].clone()
    if rank == 1:
        per_token[0, 0] = NAN  # a valid token
    return numerics.token_global_normalize(per_token, s["mask"], pg).tolist()


def _bad_reinforce_pp_nan_kl(rank, pg):
    s = dict(token_shards()[rank])
    if rank == 0:
        s["kl"] = s["kl"].clone()
        s["kl"][1, 0] = NAN  # a valid token
    return _token_algorithm("reinforce_plus_plus", s, pg, kl_coef=0.1, gamma=0.9)


def _bad_no_valid_token_anywhere(rank, pg):
    s = token_shards()[rank]
    return numerics.masked_whiten(s["per_token"], torch.zeros_like(s["mask"]), pg).tolist()


def _bad_check_finite(rank, pg):
    s = token_shards()[rank]
    values = s["per_token"].clone()
    if rank == 0:
        values[2, 1] = float("-inf")
    numerics.check_finite(values, s["mask"], pg, what="test values")
    return "ok"


def _still_in_sync(rank, pg):
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t, group=pg)
    return t.item()


CHECKS = {
    name: fn for name, fn in globals().items() if name.startswith("_") and callable(fn)
    and name not in ("_gen", "_token_algorithm", "off_policy_shard") and not name.startswith("__")
}
ORDER = [n for n in CHECKS if not n.startswith("_bad") and n != "_still_in_sync"] + \
        [n for n in CHECKS if n.startswith("_bad")] + ["_still_in_sync"]


def run_rank(rank, port, queue, timeout_s):
    """Entry point of one spawned rank: run every check in ORDER, report (rank, {name: result})."""
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    results = {}
    try:
        dist.init_process_group("gloo", rank=rank, world_size=WORLD,
                                timeout=datetime.timedelta(seconds=timeout_s))
        pg = dist.new_group([0, 1])  # an explicit group, like a data-parallel group
        for name in ORDER:
            try:
                results[name] = ("ok", CHECKS[name](rank, pg))
            except Exception as exc:  # reported to the parent, which decides what was expected
                results[name] = ("error", type(exc).__name__, str(exc))
        dist.destroy_process_group()
    except Exception:
        results["__fatal__"] = ("error", "fatal", traceback.format_exc())
    queue.put((rank, results))
