"""Worker side of test_sharding.py: runs in each spawned gloo rank (imported by plain name, not collected).

Each check builds the same model on both ranks, a replicated ``TorchBackend`` (gradient all-reduce) and
a ``ShardedTorchBackend`` (FSDP2) from it, feeds both the same uneven shards of one batch (rank 0 holds
more rows and runs more micro-batches than rank 1, so the sharded path's lock-step is exercised), and
returns plain numbers: the largest relative differences and the values they were measured on.
"""

from __future__ import annotations

import datetime
import traceback

import torch
import torch.distributed as dist

from relax.algorithms import AlgorithmConfig, PolicyLossInputs
from relax.algorithms.grpo import GRPO
from relax.backends.sharded_backend import ShardedTorchBackend
from relax.backends.torch_backend import TorchBackend
from relax.models.batch import TokenBatch
from relax.models.tiny.weights import load_warmup_model

WORLD = 2
ROWS = (slice(0, 4), slice(4, 6))  # rank 0: 4 rows, rank 1: 2 rows


def whole_batch(vocab: int) -> tuple[TokenBatch, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    n, p, t = 6, 3, 5
    response_mask = torch.arange(t)[None, :] < torch.tensor([5, 2, 4, 3, 5, 1])[:, None]
    prompt_mask = torch.ones(n, p, dtype=torch.bool)
    prompt_mask[1, 0] = prompt_mask[4, :2] = False  # left padding
    batch = TokenBatch(prompt_ids=torch.randint(3, vocab, (n, p), generator=g), prompt_mask=prompt_mask,
                       response_ids=torch.randint(3, vocab, (n, t), generator=g).masked_fill(~response_mask, 0),
                       response_mask=response_mask)
    advantages = (torch.randn(n, 1, generator=g) * response_mask).float()
    return batch, advantages


def _loss_fn(batch, old, advantages, tokens):
    algorithm = GRPO(AlgorithmConfig())

    def loss_fn(lp, rows):
        return algorithm.policy_loss(PolicyLossInputs(
            log_probs=lp.log_probs, old_log_probs=old[rows], advantages=advantages[rows],
            response_mask=batch.response_mask[rows], global_num_tokens=tokens))
    return loss_fn


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30))


def _full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _pair(rank, pg, *, bf16=False, budget=None, mb=2):
    model = load_warmup_model(None)
    options = dict(lr=1e-3, clip_grad=1.0, bf16=bf16, max_tokens_per_micro_batch=budget)
    replicated = TorchBackend(load_warmup_model(None), process_group=pg, **options)
    sharded = ShardedTorchBackend(model, process_group=pg, **options)
    batch, advantages = whole_batch(model.config.vocab_size)
    mine = batch.select(ROWS[rank])
    old = replicated.compute_log_probs(mine, micro_batch_size=mb).log_probs
    loss_fn = _loss_fn(mine, old, advantages[ROWS[rank]], float(batch.response_mask.sum()))
    return replicated, sharded, mine, old, loss_fn


def _training(rank, pg, *, bf16=False, budget=None, steps=3):
    """Per step: loss and grad norm of both paths; the gradients after step 1 and the weights after the
    last step (largest relative difference over all tensors)."""
    mb = 2
    replicated, sharded, mine, old, loss_fn = _pair(rank, pg, bf16=bf16, budget=budget, mb=mb)
    old_sharded = sharded.compute_log_probs(mine, micro_batch_size=mb).log_probs
    out = {"old_log_probs": _rel(old_sharded, old), "loss": [], "grad_norm": []}
    for step in range(steps):
        a = replicated.train_step(mine, loss_fn, micro_batch_size=mb)
        b = sharded.train_step(mine, loss_fn, micro_batch_size=mb)
        out["loss"].append((a["loss"], b["loss"]))
        out["grad_norm"].append((a["grad_norm"], b["grad_norm"]))
        if step == 0:
            grads = dict(sharded.model.named_parameters())
            out["grads"] = max(_rel(_full(grads[n].grad), p.grad) for n, p in replicated.model.named_parameters())
            pairs = [(_full(grads[n].grad).double(), p.grad.double()) for n, p in replicated.model.named_parameters()]
            out["grads_whole"] = (sum(float((a - b).pow(2).sum()) for a, b in pairs)
                                  / sum(float(b.pow(2).sum()) for _, b in pairs)) ** 0.5
    # Adam divides each gradient by its own magnitude, so an element whose gradient is ~0 moves by up to
    # lr in either direction on float32 rounding: the weights are compared as a whole, relative to the
    # distance both paths moved them
    weights = dict(sharded.model.named_parameters())
    start = dict(load_warmup_model(None).named_parameters())
    diff = sum(float((_full(weights[n].detach()) - p.detach()).double().pow(2).sum())
               for n, p in replicated.model.named_parameters())
    moved_sq = sum(float((p.detach() - start[n].detach()).double().pow(2).sum())
                   for n, p in replicated.model.named_parameters())
    out["weights"] = (diff / moved_sq) ** 0.5
    out["moved"] = moved_sq ** 0.5
    return out, replicated, sharded, mine, loss_fn


def fp32(rank, pg):
    return _training(rank, pg)[0]


def packed(rank, pg):
    return _training(rank, pg, budget=12)[0]


def bf16(rank, pg):
    return _training(rank, pg, bf16=True, steps=1)[0]


def checkpoint(rank, pg):
    """state_dict -> a fresh sharded backend and a single-process one (another number of ranks): one more
    step on each continues exactly like the original sharded / replicated backend."""
    out, replicated, sharded, mine, loss_fn = _training(rank, pg, steps=2)
    state = [sharded.state_dict()]  # a collective: every rank joins, rank 0 keeps the whole tensors
    dist.broadcast_object_list(state, src=0, group=pg)  # the runtime hands rank 0's state to every rank
    state = state[0]
    resumed = ShardedTorchBackend(load_warmup_model(None), process_group=pg, lr=1e-3, clip_grad=1.0)
    resumed.load_state_dict(state)
    one_rank = TorchBackend(load_warmup_model(None), lr=1e-3, clip_grad=1.0)
    one_rank.load_state_dict(state)  # a replicated backend reads the sharded checkpoint
    if rank == 0:  # the checkpoint holds the sharded backend's whole tensors, and a single rank resumes them
        exported = sharded.export_weights()
        out["state_is_the_weights"] = all(torch.equal(state["model"][k], v) for k, v in exported.items())
        mine_state = one_rank.state_dict()
        out["one_rank_resumes"] = (
            all(torch.equal(mine_state["model"][k], v) for k, v in state["model"].items())
            and all(torch.equal(mine_state["optimizer"]["state"][i][key], s[key])
                    for i, s in state["optimizer"]["state"].items() for key in s))
    else:
        sharded.export_weights()
        out["state_is_the_weights"] = out["one_rank_resumes"] = True
    a = sharded.train_step(mine, loss_fn, micro_batch_size=2)
    b = resumed.train_step(mine, loss_fn, micro_batch_size=2)
    out["resumed_loss"] = (a["loss"], b["loss"])
    exported_a, exported_b = sharded.export_weights(), resumed.export_weights()
    if rank == 0:
        out["resumed_weights_equal"] = all(torch.equal(exported_a[k], exported_b[k]) for k in exported_a)
        out["exported_keys"] = sorted(exported_a) == sorted(one_rank.model.state_dict())
    else:
        out["resumed_weights_equal"] = exported_a == exported_b == {}  # rank 1 joins and keeps nothing
        out["exported_keys"] = True
    out["step"] = resumed.step
    return out


def reference(rank, pg):
    """A sharded frozen reference gives the runtime's (replicated) reference pass, also on a rank
    without rows, packed and padded."""
    from relax.config.run import RunConfig
    from relax.runtime.step.reference_pass import reference_log_probs

    backend = ShardedTorchBackend(load_warmup_model(None), process_group=pg)
    frozen = backend.shard_frozen(load_warmup_model(None).requires_grad_(False).eval())
    plain = load_warmup_model(None).eval()
    batch, _ = whole_batch(plain.config.vocab_size)
    out = {}
    for name, budget, rows in (("padded", None, ROWS[rank]), ("packed", 12, ROWS[rank]),
                               ("empty_rank", None, ROWS[0] if rank == 0 else slice(0, 0))):
        backend.max_tokens_per_micro_batch = budget
        mine = batch.select(rows)
        got = backend.frozen_log_probs(frozen, mine, micro_batch_size=1)
        if len(mine):
            want = reference_log_probs(plain, mine, RunConfig(micro_batch_size=1, max_tokens_per_micro_batch=budget))
            out[name] = _rel(got, want)
        else:
            out[name] = 0.0 if got.shape == (0, batch.response_mask.shape[1]) else float("inf")
    return out


def hf(rank, pg):
    """A transformers model (tied embeddings), sharded per decoder layer with --recompute-activations, gives
    the replicated path's step; its gathered weights, exported as hf/, load with transformers."""
    import tempfile

    from transformers import AutoModelForCausalLM

    from relax.backends.torch_setup import enable_recompute
    from relax.models.hf.adapter import hf_forward_logits
    from relax.models.hf.checkpoint import export_hf_checkpoint
    from relax.models.hf.loading import load_hf_model

    options = dict(lr=1e-3, forward_logits=hf_forward_logits)
    model = load_hf_model(HF_DIR, dtype=torch.float32, device="cpu")
    enable_recompute(model)
    sharded = ShardedTorchBackend(model, process_group=pg, **options)
    replicated = TorchBackend(load_hf_model(HF_DIR, dtype=torch.float32, device="cpu"), process_group=pg, **options)
    batch, advantages = whole_batch(model.config.vocab_size)
    mine = batch.select(ROWS[rank])
    old = replicated.compute_log_probs(mine, micro_batch_size=2).log_probs
    loss_fn = _loss_fn(mine, old, advantages[ROWS[rank]], float(batch.response_mask.sum()))
    out = {"old_log_probs": _rel(sharded.compute_log_probs(mine, micro_batch_size=2).log_probs, old)}
    a = replicated.train_step(mine, loss_fn, micro_batch_size=2)
    b = sharded.train_step(mine, loss_fn, micro_batch_size=2)
    out["loss"], out["grad_norm"] = [(a["loss"], b["loss"])], [(a["grad_norm"], b["grad_norm"])]
    grads = dict(sharded.model.named_parameters())
    out["grads"] = max(_rel(_full(grads[n].grad), p.grad) for n, p in replicated.model.named_parameters())
    state = sharded.state_dict()
    out["hf_loads"] = True
    if rank == 0:
        with tempfile.TemporaryDirectory() as tmp:
            export_hf_checkpoint(state["model"], HF_DIR, tmp)
            loaded = AutoModelForCausalLM.from_pretrained(tmp).state_dict()
        out["hf_loads"] = all(torch.equal(loaded[k], v) for k, v in state["model"].items())
    return out


def lora(rank, pg):
    """LoRA adapters on a sharded transformers model: the replicated path's step, the same adapter payload,
    and a checkpoint that resumes exactly."""
    from relax.models.hf.adapter import hf_forward_logits
    from relax.models.hf.loading import load_hf_model
    from relax.models.hf.lora import wrap_with_lora

    def build():
        model = load_hf_model(HF_DIR, dtype=torch.float32, device="cpu")
        return wrap_with_lora(model, rank=4, alpha=8.0, dropout=0.0, target_modules=("all-linear",))

    options = dict(lr=1e-2, forward_logits=hf_forward_logits)
    torch.manual_seed(1)  # peft draws lora_A at random: the same draw for both copies
    replicated = TorchBackend(build(), process_group=pg, **options)
    torch.manual_seed(1)
    sharded = ShardedTorchBackend(build(), process_group=pg, **options)
    batch, advantages = whole_batch(replicated.model.config.vocab_size)
    mine = batch.select(ROWS[rank])
    old = replicated.compute_log_probs(mine, micro_batch_size=2).log_probs
    loss_fn = _loss_fn(mine, old, advantages[ROWS[rank]], float(batch.response_mask.sum()))
    out = {"loss": [], "grad_norm": []}
    for _ in range(2):  # the second step's loss reads the first step's (trained) adapters
        a = replicated.train_step(mine, loss_fn, micro_batch_size=2)
        b = sharded.train_step(mine, loss_fn, micro_batch_size=2)
        out["loss"].append((a["loss"], b["loss"]))
        out["grad_norm"].append((a["grad_norm"], b["grad_norm"]))
    mine_payload, theirs = sharded.export_weights(), replicated.export_weights()
    state = [sharded.state_dict()]
    dist.broadcast_object_list(state, src=0, group=pg)  # the runtime hands rank 0's state to every rank
    state = state[0]
    torch.manual_seed(2)
    resumed = ShardedTorchBackend(build(), process_group=pg, **options)
    resumed.load_state_dict(state)
    c, d = sharded.train_step(mine, loss_fn, micro_batch_size=2), resumed.train_step(mine, loss_fn, micro_batch_size=2)
    out["resumed_loss"] = (c["loss"], d["loss"])
    if rank == 0:
        out["same_keys"] = sorted(mine_payload) == sorted(theirs)
        out["payload"] = max(_rel(mine_payload[k].float(), theirs[k].float()) for k in theirs if "lora_" in k)
    else:
        out["same_keys"], out["payload"] = mine_payload == {}, 0.0
    return out


HF_DIR = None  # the parent's tiny random transformers checkpoint (run_rank's hf_dir)
ORDER = ["fp32", "packed", "bf16", "checkpoint", "reference", "hf", "lora"]


def run_rank(rank: int, port: int, queue, timeout_s: float, hf_dir: str, names=None) -> None:
    global HF_DIR
    HF_DIR = hf_dir
    torch.set_num_threads(1)
    results = {}
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                                timeout=datetime.timedelta(seconds=timeout_s))
        pg = dist.group.WORLD
        for name in names or ORDER:
            torch.manual_seed(0)
            results[name] = globals()[name](rank, pg)
    except Exception:  # noqa: BLE001 - reported to the parent, which fails the test with it
        results["__fatal__"] = traceback.format_exc()
    finally:
        queue.put((rank, results))
        if dist.is_initialized():
            dist.destroy_process_group()

