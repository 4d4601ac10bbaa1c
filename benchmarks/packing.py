"""One optimizer step on padded micro-batches vs token-budget packed ones (``--max-tokens-per-micro-batch``).

A Qwen2-shaped random checkpoint (hidden 256, 6 layers, 4 heads / 2 KV heads, MLP 512, vocabulary
32k, untied embeddings: ~20M parameters, built in memory by ``relax.models.hf.tiny_random``; nothing
is downloaded) trains one GRPO mini-batch of ``--samples`` sequences: prompts of 8..32 tokens
(left-padded to 32), responses spread uniformly over ``4..--max-response`` tokens (right-padded).

- padded: ``--micro-batch-size`` rows per forward/backward, every row at the full width P + T;
- packed: the same samples in micro-batches of at most ``--micro-batch-size x (P + T)`` real tokens
  (the padded micro-batch's size, so the memory bound is the same), each one padding-free row.

Both backends start from the same weights; ``max_grad_rel_diff`` is max |g_packed - g_padded| over
all parameters of the first step, relative to max |g_padded|. Step time: the median over
``--repeats`` steps taken alternately (padded, packed, ...), after one warm-up step each; on CPU the
process's CPU time, which other jobs on a shared machine do not inflate (wall times are reported too).

    python benchmarks/packing.py [--samples 32] [--micro-batch-size 8] [--max-response 128] [--json]
    python benchmarks/packing.py --smoke     # a tiny model, one step each: for the test suite

The last line with ``--json``: ``{"padded_step_s", "packed_step_s", "ratio", "max_grad_rel_diff", ...}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # idle OpenMP threads sleep instead of spinning into the CPU time

PROMPT_WIDTH, MIN_PROMPT, MIN_RESPONSE = 32, 8, 4


def make_batch(n: int, max_response: int, vocab: int, seed: int = 0):
    import torch

    from relax.models.batch import TokenBatch

    g = torch.Generator().manual_seed(seed)
    prompt_lens = torch.randint(MIN_PROMPT, PROMPT_WIDTH + 1, (n,), generator=g)
    response_lens = torch.randint(MIN_RESPONSE, max_response + 1, (n,), generator=g)
    prompt_mask = torch.arange(PROMPT_WIDTH)[None, :] >= PROMPT_WIDTH - prompt_lens[:, None]
    response_mask = torch.arange(max_response)[None, :] < response_lens[:, None]
    return TokenBatch(
        prompt_ids=torch.randint(3, vocab, (n, PROMPT_WIDTH), generator=g) * prompt_mask,
        prompt_mask=prompt_mask,
        response_ids=torch.randint(3, vocab, (n, max_response), generator=g) * response_mask,
        response_mask=response_mask,
    )


def build_model(hidden: int, layers: int, vocab: int):
    import torch
    from transformers import AutoModelForCausalLM

    from relax.models.hf.tiny_random import model_config

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(model_config("qwen2", vocab, hidden=hidden, layers=layers))


def run(args) -> dict:
    import copy

    import torch

    from relax.algorithms import AlgorithmConfig
    from relax.algorithms.grpo import GRPO
    from relax.backends.torch_backend import TorchBackend
    from relax.models.hf.adapter import hf_forward_logits
    from relax.runtime.step.losses import policy_loss_fn

    torch.set_num_threads(args.threads)
    model = build_model(args.hidden, args.layers, args.vocab)
    params = sum(p.numel() for p in model.parameters())
    batch = make_batch(args.samples, args.max_response, args.vocab)
    budget = args.micro_batch_size * (PROMPT_WIDTH + args.max_response)
    padded = TorchBackend(copy.deepcopy(model), lr=1e-6, forward_logits=hf_forward_logits)
    packed = TorchBackend(model, lr=1e-6, forward_logits=hf_forward_logits, max_tokens_per_micro_batch=budget)

    g = torch.Generator().manual_seed(1)
    mask = batch.response_mask
    old = padded.compute_log_probs(batch, micro_batch_size=args.micro_batch_size).log_probs
    advantages = torch.randn(len(batch), 1, generator=g).expand_as(mask) * mask
    loss_fn = policy_loss_fn(GRPO(AlgorithmConfig()), old_log_probs=old, advantages=advantages, response_mask=mask,
                             global_num_tokens=float(mask.sum()), global_num_sequences=float(len(batch)))

    def step(backend) -> tuple[float, float, dict]:
        t0, c0 = time.perf_counter(), time.process_time()
        metrics = backend.train_step(batch, loss_fn, micro_batch_size=args.micro_batch_size, with_entropy=False)
        return time.perf_counter() - t0, time.process_time() - c0, metrics

    # the first step of each (same weights): the gradient comparison, and the warm-up
    *_, padded_metrics = step(padded)
    grads = {n: p.grad.clone() for n, p in padded.model.named_parameters()}
    *_, packed_metrics = step(packed)
    scale = max(float(g.abs().max()) for g in grads.values())
    max_diff = max(float((p.grad - grads[n]).abs().max()) for n, p in packed.model.named_parameters())
    times = {"padded": ([], []), "packed": ([], [])}
    for _ in range(args.repeats):
        for name, backend in (("padded", padded), ("packed", packed)):
            wall, cpu, _ = step(backend)
            times[name][0].append(wall)
            times[name][1].append(cpu)
    on_cpu = next(model.parameters()).device.type == "cpu"
    pick = 1 if on_cpu else 0
    padded_s = statistics.median(times["padded"][pick])
    packed_s = statistics.median(times["packed"][pick])
    return {
        "params": params,
        "samples": args.samples,
        "real_tokens": int(batch.attention_mask.sum()),
        "padded_tokens": int(batch.input_ids.numel()),
        "padded_micro_batches": -(-args.samples // args.micro_batch_size),
        "packed_micro_batches": int(packed_metrics["micro_batches"]),
        "token_budget": budget,
        "timing": "cpu_time" if on_cpu else "wall",
        "padded_step_s": padded_s,
        "packed_step_s": packed_s,
        "ratio": packed_s / padded_s,
        "padded_wall_s": statistics.median(times["padded"][0]),
        "packed_wall_s": statistics.median(times["packed"][0]),
        "loss_padded": padded_metrics["loss"],
        "loss_packed": packed_metrics["loss"],
        "max_grad_rel_diff": max_diff / scale,
        "threads": args.threads,
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--max-response", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", action="store_true", help="end with one JSON line of the results")
    parser.add_argument("--smoke", action="store_true", help="a tiny model, one step each: checks that it runs")
    args = parser.parse_args(argv)
    if args.smoke:
        args.hidden, args.layers, args.vocab, args.repeats = 64, 1, 512, 1
        args.samples, args.micro_batch_size, args.max_response = 6, 2, 16
    r = run(args)
    print(f"model: {r['params'] / 1e6:.1f}M parameters; {r['samples']} samples, {r['real_tokens']} real tokens of "
          f"{r['padded_tokens']} padded ({1 - r['real_tokens'] / r['padded_tokens']:.0%} padding)")
    print(f"padded: {r['padded_micro_batches']} micro-batches, {r['padded_step_s']:.2f} s ({r['timing']})")
    print(f"packed: {r['packed_micro_batches']} micro-batches of <= {r['token_budget']} tokens, "
          f"{r['packed_step_s']:.2f} s ({r['ratio']:.2f}x padded); max_grad_rel_diff {r['max_grad_rel_diff']:.1e}")
    if args.json:
        print(json.dumps(r))
    return r


if __name__ == "__main__":
    main()
