"""Peak memory and step time of one torch-backend training step: float32 vs ``--bf16`` vs
``--recompute-activations`` (vs both) vs LoRA (``--lora-rank 16`` on every linear layer), on a random
Hugging Face checkpoint of a realistic shape.

The model is a Qwen3-style decoder (hidden 512, 8 layers, 4 heads / 2 KV heads, MLP 1024,
vocabulary 32k, untied embeddings: ~52M parameters) built with ``relax.models.hf.tiny_random`` and
saved to a temporary directory; the batch is a GRPO mini-batch of ``--samples`` sequences of
``--prompt-len + --response-len`` tokens. Each configuration runs in its own process, built by
``TorchBackend.for_policy`` from a ``RunConfig`` exactly as ``relax train --hf-checkpoint`` builds it:
one warm-up step (it allocates the Adam state), then ``--repeats`` timed steps.

Memory: on CUDA, ``torch.cuda.max_memory_allocated`` of a step; on CPU, the process's peak resident
set (``VmHWM``, reset before each step through ``/proc/self/clear_refs``) above the resident set
measured after the imports, before the model is built (weights + gradients + Adam state +
activations), with glibc's mmap threshold fixed so freed tensors go back to the OS. Step time: wall
time on CUDA; on CPU the process's CPU time (median), which other jobs on a shared machine do not
inflate. Ratios are against float32 measured in the same run.

Sharded (``--sharding fsdp``) at 2 and 4 ranks: the ranks are processes on one gloo group, built by
``TorchBackend.for_policy`` with the process group as ``relax train --actor-num-workers N`` builds them,
each training on its 1/N of the batch. Their rows report the bytes of parameters, gradients and Adam
state this rank holds (its shards), against the replicated ``fp32`` rank's (whole tensors); the
largest rank's count is shown (shards differ by at most one row).

    python benchmarks/memory.py [--samples 4] [--prompt-len 64] [--response-len 192] [--repeats 3]
    python benchmarks/memory.py --smoke     # a tiny model, one step each (sharded: 2 ranks): for the test suite
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIGS = {
    "fp32": {},
    "bf16": {"bf16": True},
    "recompute": {"recompute_activations": True},
    "bf16+recompute": {"bf16": True, "recompute_activations": True},
    "lora": {"lora_rank": 16, "lora_alpha": 32.0},  # adapters on every linear layer; needs peft
    "fsdp x2": {"sharding": "fsdp", "actor_num_workers": 2},  # one process per rank (--sharding fsdp)
    "fsdp x4": {"sharding": "fsdp", "actor_num_workers": 4},
}


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current resident set


def build_checkpoint(directory: Path, *, hidden: int, layers: int, vocab: int) -> Path:
    import torch
    from transformers import AutoModelForCausalLM

    from relax.models.hf.tiny_random import model_config

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(model_config("qwen3", vocab, hidden=hidden, layers=layers))
    model.save_pretrained(str(directory))
    return directory


def worker(args) -> dict:
    import torch

    torch.set_num_threads(args.threads)
    from relax.algorithms import AlgorithmConfig, PolicyLossInputs
    from relax.algorithms.grpo import GRPO
    from relax.backends.optim import optimizer_state_bytes
    from relax.backends.torch_backend import TorchBackend
    from relax.models.batch import TokenBatch
    from relax.models.factory import build_policy_model
    from relax.config.run import RunConfig

    cuda = torch.cuda.is_available()
    baseline = 0 if cuda else _rss_kib("VmRSS")
    config = RunConfig(hf_checkpoint=args.checkpoint, lr=1e-5, **CONFIGS[args.worker])
    model = build_policy_model(config)
    group = None
    if config.actor_num_workers > 1:  # one rank of a sharded group (main starts one process per rank)
        import torch.distributed as dist

        dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{args.port}",
                                rank=args.rank, world_size=config.actor_num_workers)
        group = dist.group.WORLD
        if cuda:
            torch.cuda.set_device(args.rank % torch.cuda.device_count())
            model = model.to(torch.cuda.current_device())
    backend = TorchBackend.for_policy(config, model, process_group=group)

    n, p, t = args.samples, args.prompt_len, args.response_len
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    response_mask = torch.arange(t)[None, :] < torch.randint(t // 2, t + 1, (n,), generator=g)[:, None]
    batch = TokenBatch(
        prompt_ids=torch.randint(3, vocab, (n, p), generator=g),
        prompt_mask=torch.ones(n, p, dtype=torch.bool),
        response_ids=torch.randint(3, vocab, (n, t), generator=g).masked_fill(~response_mask, 0),
        response_mask=response_mask,
    )
    algorithm = GRPO(AlgorithmConfig())
    advantages = torch.randn(n, 1, generator=g).expand_as(response_mask) * response_mask
    tokens = float(response_mask.sum())  # the whole batch's: every rank's loss divides by it
    if group is not None:  # this rank's rows of the batch
        rows = slice(args.rank * n // config.actor_num_workers, (args.rank + 1) * n // config.actor_num_workers)
        batch, advantages, response_mask = batch.select(rows), advantages[rows], response_mask[rows]
    old = backend.compute_log_probs(batch).log_probs

    def loss_fn(lp, rows):
        return algorithm.policy_loss(PolicyLossInputs(
            log_probs=lp.log_probs, old_log_probs=old[rows].to(lp.log_probs.device),
            advantages=advantages[rows].to(lp.log_probs.device),
            response_mask=batch.response_mask[rows].to(lp.log_probs.device), global_num_tokens=tokens))

    backend.train_step(batch, loss_fn)  # warm-up: allocates gradients and the Adam state
    times, cpu_times, peaks = [], [], []
    for _ in range(args.repeats):
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        else:
            _reset_peak()
        t0, c0 = time.perf_counter(), time.process_time()
        backend.train_step(batch, loss_fn)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        cpu_times.append(time.process_time() - c0)
        peaks.append(torch.cuda.max_memory_allocated() if cuda else (_rss_kib("VmHWM") - baseline) * 1024)
    params = sum(p.numel() for p in backend.model.parameters())
    trainable = sum(p.numel() for p in backend.model.parameters() if p.requires_grad)
    held = _held_bytes(backend)
    if group is not None:
        torch.distributed.destroy_process_group()
    return {
        "config": args.worker,
        "device": "cuda" if cuda else "cpu",
        "params": params,
        "trainable": trainable,
        # CUDA: wall time. CPU: the process's CPU time, which other jobs on a shared machine do not inflate
        "step_s": statistics.median(times) if cuda else statistics.median(cpu_times),
        "wall_s": statistics.median(times),
        "peak_mib": max(peaks) / 2**20,
        "optimizer_mib": optimizer_state_bytes(backend.optimizer) / 2**20,
        "weights_mib": sum(p.numel() * p.element_size() for p in backend.model.parameters()) / 2**20,
        **{f"{name}_mib": value / 2**20 for name, value in held.items()},
    }


def _held_bytes(backend) -> dict[str, int]:
    """Bytes of parameters, gradients and optimizer state this rank holds (a sharded tensor: its shard)."""
    from torch.distributed.tensor import DTensor

    from relax.backends.optim import optimizer_state_bytes

    def local(t):
        return t.to_local() if isinstance(t, DTensor) else t

    params = list(backend.model.parameters())
    return {
        "param": sum(local(p).numel() * p.element_size() for p in params),
        "grad": sum(local(p.grad).numel() * p.grad.element_size() for p in params if p.grad is not None),
        "adam": optimizer_state_bytes(backend.optimizer),
    }


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--response-len", type=int, default=192)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--worker", choices=list(CONFIGS), help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint", help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--smoke", action="store_true", help="a tiny model, one step each: checks that it runs")
    args = parser.parse_args(argv)
    if args.smoke:
        args.hidden, args.layers, args.vocab, args.repeats = 64, 1, 512, 1
        args.samples, args.prompt_len, args.response_len = 2, 8, 8
        args.configs = [c for c in args.configs if c != "fsdp x4"]  # two ranks show the sharded path runs
    if args.worker:
        print(json.dumps(worker(args)))
        return []

    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 16), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(args.threads),
           "OMP_WAIT_POLICY": "PASSIVE"}  # idle OpenMP threads sleep instead of spinning into the CPU time
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = build_checkpoint(Path(tmp), hidden=args.hidden, layers=args.layers, vocab=args.vocab)
        for name in args.configs:
            cmd = [sys.executable, __file__, "--worker", name, "--checkpoint", str(ckpt),
                   "--samples", str(args.samples), "--prompt-len", str(args.prompt_len),
                   "--response-len", str(args.response_len), "--repeats", str(args.repeats),
                   "--threads", str(args.threads)]
            results.append(_run_ranks(cmd, CONFIGS[name].get("actor_num_workers", 1), env))
    ref = results[0]
    print(f"model: {ref['params'] / 1e6:.1f}M parameters (hidden {args.hidden}, {args.layers} layers, vocab "
          f"{args.vocab}); batch {args.samples} x ({args.prompt_len} + {args.response_len}) tokens; {ref['device']}")
    step = "step s" if ref["device"] == "cuda" else "CPU s"
    print(f"{'config':<16}{'peak MiB':>10}{'x ' + ref['config']:>10}{step:>9}{'x ' + ref['config']:>10}"
          f"{'Adam MiB':>10}{'trained':>10}")
    for r in results:
        print(f"{r['config']:<16}{r['peak_mib']:>10.0f}{r['peak_mib'] / ref['peak_mib']:>10.2f}{r['step_s']:>9.2f}"
              f"{r['step_s'] / ref['step_s']:>10.2f}{r['optimizer_mib']:>10.1f}{r['trainable'] / 1e6:>9.2f}M")
    print(f"\nper rank, MiB held    {'params':>9}{'grads':>9}{'Adam':>9}{'total':>9}{'x ' + ref['config']:>9}")
    for r in results:
        total = r["param_mib"] + r["grad_mib"] + r["adam_mib"]
        base = ref["param_mib"] + ref["grad_mib"] + ref["adam_mib"]
        print(f"{r['config']:<22}{r['param_mib']:>9.1f}{r['grad_mib']:>9.1f}{r['adam_mib']:>9.1f}{total:>9.1f}"
              f"{total / base:>9.2f}")
    return results


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_ranks(cmd: list[str], ranks: int, env: dict) -> dict:
    """One worker process, or one per rank of a sharded group: the rank holding the most."""
    if ranks == 1:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])
    port = str(_free_port())
    procs = [subprocess.Popen(cmd + ["--rank", str(r), "--port", port], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(ranks)]
    outs = [p.communicate() for p in procs]
    for p, (_, err) in zip(procs, outs):
        if p.returncode:
            raise RuntimeError(f"a rank of {cmd[cmd.index('--worker') + 1]} failed:\n{err[-2000:]}")
    per_rank = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    return max(per_rank, key=lambda r: r["param_mib"] + r["grad_mib"] + r["adam_mib"])


if __name__ == "__main__":
    main()
