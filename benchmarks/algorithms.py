"""Benchmark: vectorized group statistics of relax.algorithms.numerics vs two references.

Measured in one run, single-threaded, for N = 10^3 .. 10^6 samples, K = 3 reward components,
groups of 8, group ids shuffled over the batch (non-contiguous):

- GRPO normalize_rewards (weighted sum of K components, then per group (r - mean) / (std + 1e-6));
- GDPO normalize_rewards (per component and group (r - mean) / (std + 1e-4), constant -> 0, weighted sum);
- GDPO whitening (compute_advantages' step 3: per mini-batch segment of 256 samples).

References:
(a) a straightforward Python loop: one iteration per group (per segment for whitening), with torch
    ops on that group's index tensor;
(b) a reshape-based implementation ``x.view(-1, 8, K)`` that only works when groups are contiguous
    and equal-sized (written with in-place ops, like ours); it is timed on a contiguous copy of the
    same data.

All three compute the same float64 two-pass statistics; the script checks that their outputs agree
before timing. Printed: milliseconds per call and the ratios (a)/ours (higher = ours faster) and
ours/(b) (lower = ours closer to the contiguous-only reshape). Target: (a)/ours >= 50 at N = 10^5
and ours/(b) <= 2. Run: ``python benchmarks/algorithms.py [--max-n 1000000] [--loop-budget-s 60]``
(``--smoke``: N = 10^3 only, for the test suite).
"""

from __future__ import annotations

import argparse
import time

import torch

from relax.algorithms import AdvantageInputs, AlgorithmConfig, get_algorithm
from relax.algorithms import numerics as N

K, GROUP, SEGMENT = 3, 8, 256
WEIGHTS = (1.0, 0.5, 2.0)
KEYS = ("correct", "format", "length")


# ---- (a) straightforward per-group Python loops ----

def _group_positions(ids: torch.Tensor) -> list[torch.Tensor]:
    positions: dict[int, list[int]] = {}
    for i, g in enumerate(ids.tolist()):
        positions.setdefault(g, []).append(i)
    return [torch.tensor(p) for p in positions.values()]


def loop_grpo(rewards, ids):
    r = rewards.double() @ torch.tensor(WEIGHTS, dtype=torch.float64)
    out = torch.empty_like(r)
    for idx in _group_positions(ids):
        x = r[idx]
        out[idx] = (x - x.mean()) / (x.std() + N.GRPO_STD_EPS)
    return out.float()


def loop_gdpo(rewards, ids):
    r = rewards.double()
    z = torch.empty_like(r)
    for idx in _group_positions(ids):
        x = r[idx]
        zx = (x - x.mean(0)) / (x.std(0) + N.GDPO_EPS)
        z[idx] = torch.where(x.amin(0) == x.amax(0), torch.zeros_like(zx), zx)
    return (z @ torch.tensor(WEIGHTS, dtype=torch.float64)).float()


def loop_whiten(values):
    x = values.double()
    out = torch.empty_like(x)
    for start in range(0, x.shape[0], SEGMENT):
        s = x[start:start + SEGMENT]
        w = (s - s.mean()) / (s.std() + N.GDPO_EPS)
        out[start:start + SEGMENT] = torch.zeros_like(w) if bool(s.min() == s.max()) else w
    return out.float()


# ---- (b) reshape-based, contiguous equal-sized groups only ----

def reshape_grpo(rewards_contig):
    r = (rewards_contig.double() @ torch.tensor(WEIGHTS, dtype=torch.float64)).view(-1, GROUP)
    dev = r - r.mean(1, keepdim=True)
    std = dev.square().sum(1, keepdim=True).div_(GROUP - 1).sqrt_()
    return dev.div_(std.add_(N.GRPO_STD_EPS)).view(-1).float()


def reshape_gdpo(rewards_contig):
    r = rewards_contig.double().view(-1, GROUP, K)
    dev = r - r.mean(1, keepdim=True)
    std = dev.square().sum(1, keepdim=True).div_(GROUP - 1).sqrt_()
    constant = r.amin(1, keepdim=True) == r.amax(1, keepdim=True)
    z = dev.div_(std.add_(N.GDPO_EPS)).masked_fill_(constant, 0.0)
    return (z.view(-1, K) @ torch.tensor(WEIGHTS, dtype=torch.float64)).float()


def reshape_whiten(values):
    x = values.double().view(-1, SEGMENT)
    dev = x - x.mean(1, keepdim=True)
    std = dev.square().sum(1, keepdim=True).div_(SEGMENT - 1).sqrt_()
    constant = x.amin(1, keepdim=True) == x.amax(1, keepdim=True)
    return dev.div_(std.add_(N.GDPO_EPS)).masked_fill_(constant, 0.0).view(-1).float()


def best_ms(fn, *args, repeats: int) -> float:
    fn(*args)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(*args)
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--max-n", type=int, default=10**6)
    parser.add_argument("--loop-budget-s", type=float, default=60.0,
                        help="skip the Python-loop reference when its single run is predicted to exceed this")
    parser.add_argument("--smoke", action="store_true", help="N = 10^3 only: checks that the script runs")
    args = parser.parse_args(argv)
    if args.smoke:
        args.max_n = 10**3
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = AlgorithmConfig(reward_keys=KEYS, reward_weights=WEIGHTS)
    grpo, gdpo = get_algorithm("grpo")(cfg), get_algorithm("gdpo")(cfg)

    def gdpo_whiten(values):
        mask = torch.ones(values.shape[0], 1, dtype=torch.bool)
        sizes = (SEGMENT,) * (values.shape[0] // SEGMENT)
        inputs = AdvantageInputs(rewards=values, response_mask=mask, segment_sizes=sizes)
        return gdpo.compute_advantages(inputs)[0][:, 0]

    print(f"torch {torch.__version__}, threads={torch.get_num_threads()}, K={K}, group={GROUP}, "
          f"whitening segment={SEGMENT}; times are best-of-R milliseconds")
    header = (f"{'op':<14}{'N':>9}{'ours ms':>10}{'sparse-id ms':>14}{'(a) loop ms':>13}{'(b) reshape ms':>16}"
              f"{'(a)/ours':>10}{'ours/(b)':>10}")
    print(header)
    print("-" * len(header))
    loop_rate: dict[str, float] = {}  # seconds per sample of the Python loop, to predict larger N
    skipped = []
    n = 10**3
    while n <= args.max_n:
        n_eff = (n + SEGMENT - 1) // SEGMENT * SEGMENT  # a whole number of whitening segments (and groups)
        n_groups = n_eff // GROUP
        ids_contig = torch.arange(n_groups).repeat_interleave(GROUP)
        perm = torch.randperm(n_eff)
        ids = ids_contig[perm]  # shuffled, non-contiguous groups with dense ids
        sparse_ids = (torch.randint(-2**62, 2**62, (n_groups,)))[ids]  # same partition, arbitrary int64 ids
        rewards = torch.randint(0, 3, (n_eff, K)).double() + torch.rand(n_eff, K).double().round(decimals=1)
        rewards_contig = torch.empty_like(rewards)
        rewards_contig[perm] = rewards  # sample perm[i] of the contiguous layout is sample i of the shuffled one
        values = grpo.normalize_rewards(rewards, ids)
        repeats = 20 if n_eff <= 10**4 else 5 if n_eff <= 10**5 else 3
        cases = [
            ("grpo_normalize", lambda: grpo.normalize_rewards(rewards, ids),
             lambda: grpo.normalize_rewards(rewards, sparse_ids),
             lambda: loop_grpo(rewards, ids), lambda: reshape_grpo(rewards_contig)),
            ("gdpo_normalize", lambda: gdpo.normalize_rewards(rewards, ids),
             lambda: gdpo.normalize_rewards(rewards, sparse_ids),
             lambda: loop_gdpo(rewards, ids), lambda: reshape_gdpo(rewards_contig)),
            ("gdpo_whiten", lambda: gdpo_whiten(values), None,
             lambda: loop_whiten(values), lambda: reshape_whiten(values)),
        ]
        for op, ours, ours_sparse, loop, reshape in cases:
            # Same numbers before timing: shuffled-layout outputs map to the contiguous layout via perm.
            out = ours()
            ref_b = reshape()
            ref_b_shuffled = ref_b if op == "gdpo_whiten" else ref_b[perm]
            torch.testing.assert_close(out, ref_b_shuffled, rtol=1e-5, atol=1e-5)
            if ours_sparse is not None:
                assert torch.equal(ours_sparse(), out)
            t_ours = best_ms(ours, repeats=repeats)
            t_sparse = best_ms(ours_sparse, repeats=repeats) if ours_sparse else float("nan")
            t_b = best_ms(reshape, repeats=repeats)
            predicted = loop_rate.get(op, 0.0) * n_eff
            if predicted > args.loop_budget_s:
                t_a = float("nan")
                skipped.append(f"{op} N={n_eff}: predicted {predicted:.0f} s")
            else:
                t0 = time.perf_counter()
                torch.testing.assert_close(loop(), out, rtol=1e-5, atol=1e-5)
                t_a = (time.perf_counter() - t0) * 1e3  # one run: the loop is slow and its timing is stable
                loop_rate[op] = t_a / 1e3 / n_eff
            print(f"{op:<14}{n_eff:>9}{t_ours:>10.2f}{t_sparse:>14.2f}{t_a:>13.1f}{t_b:>16.2f}"
                  f"{t_a / t_ours:>10.1f}{t_ours / t_b:>10.2f}")
        n *= 10
    if skipped:
        print("Python-loop reference skipped (over --loop-budget-s):", "; ".join(skipped))
    print("ours: group ids used directly as scatter indices (dense ids); sparse-id: arbitrary int64 ids, "
          "compacted with torch.unique first. (a) is timed once (after checking its output), ours and (b) best-of-R.")


if __name__ == "__main__":
    main()
