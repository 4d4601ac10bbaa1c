"""Step time of the Megatron backend against the torch backend, same model and batch (CPU, TP=1).

Both backends train the shipped warm-up ``TinyCausalLM`` on the same GRPO batch of the embedded
default's shape (a 128-sample optimizer mini-batch: 5 prompt + 8 response tokens), one thread, in
one process. Timings are interleaved (torch, megatron, torch, ...) so machine load hits both alike;
the reported numbers are ratios of medians, of wall time and of the process's CPU time (on a shared
machine the CPU time is the steadier of the two: time spent descheduled does not count; gloo's
threads do). Target: <= 1.2x.

    python benchmarks/megatron_vs_torch.py [--samples 128] [--repeats 30]
    python benchmarks/megatron_vs_torch.py --smoke   # 8 samples, 1 repeat: for the test suite
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from relax.algorithms import AlgorithmConfig, PolicyLossInputs
from relax.algorithms.grpo import GRPO
from relax.models.batch import TokenBatch
from relax.backends.megatron.backend import MegatronBackend
from relax.backends.torch_backend import TorchBackend
from relax.models.tiny.weights import load_warmup_model


def make_batch(n: int, p: int = 5, t: int = 8, seed: int = 0) -> TokenBatch:
    g = torch.Generator().manual_seed(seed)
    response_len = torch.randint(3, t + 1, (n,), generator=g)
    response_mask = torch.arange(t)[None, :] < response_len[:, None]
    return TokenBatch(
        prompt_ids=torch.randint(3, 17, (n, p), generator=g),
        prompt_mask=torch.ones(n, p, dtype=torch.bool),
        response_ids=torch.randint(3, 17, (n, t), generator=g).masked_fill(~response_mask, 0),
        response_mask=response_mask,
    )


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--samples", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--smoke", action="store_true", help="8 samples, 1 repeat: checks that it runs")
    args = parser.parse_args(argv)
    if args.smoke:
        args.samples, args.repeats = 8, 1
    torch.set_num_threads(1)

    model = load_warmup_model()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    torch_backend = TorchBackend(model, lr=1e-6)
    megatron_backend = MegatronBackend(model.config, initial_weights=weights, lr=1e-6)
    batch = make_batch(args.samples)
    algorithm = GRPO(AlgorithmConfig())
    advantages = torch.randn(args.samples, 1).expand_as(batch.response_mask) * batch.response_mask
    old = torch_backend.compute_log_probs(batch).log_probs
    tokens = float(batch.response_mask.sum())

    def loss_fn(lp, rows):
        return algorithm.policy_loss(PolicyLossInputs(
            log_probs=lp.log_probs, old_log_probs=old[rows], advantages=advantages[rows],
            response_mask=batch.response_mask[rows], global_num_tokens=tokens))

    def timed(fn) -> tuple[float, float]:
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        return time.perf_counter() - t0, time.process_time() - c0

    jobs = {
        "torch train_step": lambda: torch_backend.train_step(batch, loss_fn, with_entropy=False),
        "megatron train_step": lambda: megatron_backend.train_step(batch, loss_fn, with_entropy=False),
        "torch log_probs": lambda: torch_backend.compute_log_probs(batch),
        "megatron log_probs": lambda: megatron_backend.compute_log_probs(batch),
    }
    for fn in jobs.values():  # warm-up
        for _ in range(3):
            fn()
    times = {name: [] for name in jobs}
    cpu_times = {name: [] for name in jobs}
    for _ in range(args.repeats):
        for name, fn in jobs.items():
            wall, cpu = timed(fn)
            times[name].append(wall)
            cpu_times[name].append(cpu)
    med = {name: statistics.median(v) * 1e3 for name, v in times.items()}
    cpu_med = {name: statistics.median(v) * 1e3 for name, v in cpu_times.items()}

    def ratio(m, kind):
        return round(m[f"megatron {kind}"] / m[f"torch {kind}"], 3)

    result = {
        "median_ms": {k: round(v, 2) for k, v in med.items()},
        "cpu_median_ms": {k: round(v, 2) for k, v in cpu_med.items()},
        "train_step_ratio": ratio(med, "train_step"),
        "log_probs_ratio": ratio(med, "log_probs"),
        "train_step_cpu_ratio": ratio(cpu_med, "train_step"),
        "log_probs_cpu_ratio": ratio(cpu_med, "log_probs"),
    }
    for name in jobs:
        print(f"{name:22s} {med[name]:8.2f} ms wall, {cpu_med[name]:8.2f} ms CPU (medians of {args.repeats})")
    print(f"megatron / torch train_step: {result['train_step_ratio']:.3f}x wall, "
          f"{result['train_step_cpu_ratio']:.3f}x CPU (target <= 1.2x)")
    print(f"megatron / torch log_probs:  {result['log_probs_ratio']:.3f}x wall, "
          f"{result['log_probs_cpu_ratio']:.3f}x CPU")
    return result


if __name__ == "__main__":
    main()
