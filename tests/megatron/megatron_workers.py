"""Rank functions run by ``megatron_harness.run_distributed`` (module level, so spawn can pickle them).

Each function returns plain tensors/numbers; the assertions live in the test module, in the parent.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from relax.algorithms import AlgorithmConfig
from relax.algorithms.gdpo import GDPO
from relax.algorithms.grpo import GRPO
from relax.algorithms.types import PolicyLossInputs
from relax.models.batch import TokenBatch
from relax.models.tiny.model import TinyCausalLM, TinyLMConfig

CFG = TinyLMConfig(max_seq_len=16)
LR = 1e-2
# Adam divides by sqrt(v) + eps: with the usual 1e-8, a gradient that is 0 in exact arithmetic (the
# key bias: softmax ignores a per-query constant) but 1e-10 of rounding noise still moves by ~lr, so two
# correct implementations diverge on it. A larger eps keeps the update proportional to the gradient.
ADAM_EPS = 1e-4
MICRO = 3
STEPS = 3


def initial_weights() -> dict[str, torch.Tensor]:
    """TinyCausalLM init plus noise, so biases and LayerNorm parameters are not 0/1 (a conversion that
    mixes them up would still pass on the plain init)."""
    torch.manual_seed(0)
    model = TinyCausalLM(CFG)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return model.state_dict()


def make_batch(n: int = 8, p: int = 5, t: int = 7, seed: int = 2) -> TokenBatch:
    """Left-padded prompts and right-padded responses of different lengths."""
    g = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(3, CFG.vocab_size, (n, p), generator=g)
    response_ids = torch.randint(3, CFG.vocab_size, (n, t), generator=g)
    prompt_len = torch.randint(1, p + 1, (n,), generator=g)
    response_len = torch.randint(1, t + 1, (n,), generator=g)
    prompt_mask = torch.arange(p)[None, :] >= (p - prompt_len)[:, None]
    response_mask = torch.arange(t)[None, :] < response_len[:, None]
    prompt_ids = prompt_ids.masked_fill(~prompt_mask, 0)
    response_ids = response_ids.masked_fill(~response_mask, 0)
    return TokenBatch(prompt_ids=prompt_ids, prompt_mask=prompt_mask, response_ids=response_ids, response_mask=response_mask)


def advantages_for(batch: TokenBatch, seed: int = 3) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(len(batch), 1, generator=g).expand_as(batch.response_mask) * batch.response_mask


ALGORITHM = GRPO(AlgorithmConfig(entropy_coef=0.01))


def make_loss_fn(batch: TokenBatch, old_log_probs, advantages, global_num_tokens: float):
    """GRPO's policy loss (PPO clip + entropy bonus), normalized by the whole batch's token count."""

    def loss_fn(token_log_probs, rows):
        return ALGORITHM.policy_loss(
            PolicyLossInputs(
                log_probs=token_log_probs.log_probs,
                old_log_probs=old_log_probs[rows],
                advantages=advantages[rows],
                response_mask=batch.response_mask[rows],
                entropy=token_log_probs.entropy,
                global_num_tokens=global_num_tokens,
            )
        )

    return loss_fn


def run_training(backend, batch: TokenBatch, steps: int = STEPS, micro: int = MICRO) -> dict:
    """Log-probs, entropy and a few PPO steps; everything a layout comparison needs."""
    first = backend.compute_log_probs(batch, with_entropy=True)
    # Perturb the "rollout" log-probs so the importance ratio is not 1 and clipping engages.
    old = first.log_probs + 0.3 * advantages_for(batch, seed=4)
    loss_fn = make_loss_fn(batch, old, advantages_for(batch), float(batch.response_mask.sum()))
    metrics = [backend.train_step(batch, loss_fn, micro_batch_size=micro) for _ in range(steps)]
    return {"log_probs": first.log_probs, "entropy": first.entropy, "metrics": metrics, "old": old}


def _megatron(**kwargs):
    from relax.backends.megatron.backend import MegatronBackend

    return MegatronBackend(CFG, initial_weights=initial_weights(), lr=LR, adam_eps=ADAM_EPS, clip_grad=1.0, seed=7, **kwargs)


def _reset_parallel_state() -> None:
    from megatron.core import parallel_state

    parallel_state.destroy_model_parallel()


# ---------------------------------------------------------------------------------------------


def single_rank_reference(rank: int, world: int) -> dict:
    """World 1: Megatron TP=1 vs TinyCausalLM and vs TorchBackend; checkpoint resume."""
    from relax.backends.torch_backend import TorchBackend, response_log_probs

    batch = make_batch()
    weights = initial_weights()
    reference = TinyCausalLM(CFG)
    reference.load_state_dict(weights)
    with torch.no_grad():
        ref_logits = reference(batch.input_ids, batch.attention_mask, batch.position_ids)
        ref_tokens = response_log_probs(ref_logits, batch, with_entropy=True)

    backend = _megatron()
    out = {
        "logits": backend.logits(batch),
        "ref_logits": ref_logits,
        "ref_log_probs": ref_tokens.log_probs,
        "ref_entropy": ref_tokens.entropy,
        "exported_initial": backend.export_weights(),
        "weights": weights,
    }
    out.update(run_training(backend, batch))
    out["trained"] = backend.export_weights()
    checkpoint = backend.state_dict()
    out["checkpoint"] = checkpoint
    out["next_step"] = backend.train_step(batch, _replay_loss_fn(batch, out), micro_batch_size=MICRO)
    out["after_next"] = backend.export_weights()
    backend.load_state_dict(checkpoint)
    out["resumed_step"] = backend.train_step(batch, _replay_loss_fn(batch, out), micro_batch_size=MICRO)
    out["after_resumed"] = backend.export_weights()

    torch_backend = TorchBackend(reference, lr=LR, eps=ADAM_EPS, clip_grad=1.0)
    torch_run = run_training(torch_backend, batch)
    out["torch_metrics"] = torch_run["metrics"]
    out["torch_trained"] = torch_backend.export_weights()
    return out


def _replay_loss_fn(batch, run):
    return make_loss_fn(batch, run["old"], advantages_for(batch), float(batch.response_mask.sum()))


def _plain_gradients(weights, batch: TokenBatch, loss_fn) -> dict[str, torch.Tensor]:
    """Reference gradient with plain torch autograd on TinyCausalLM."""
    from relax.backends.torch_backend import response_log_probs

    model = TinyCausalLM(CFG)
    model.load_state_dict(weights)
    logits = model(batch.input_ids, batch.attention_mask, batch.position_ids)
    loss_fn(response_log_probs(logits, batch, with_entropy=True), slice(0, len(batch))).loss.backward()
    return {k: p.grad.detach().clone() for k, p in model.named_parameters()}


def two_ranks(rank: int, world: int, tp1_checkpoint: dict, tp1_old: torch.Tensor) -> dict:
    """World 2, three layouts in turn: TP=2 (+ resume of a TP=1 checkpoint), DP=2 (gradients and
    advantages on the training ranks), PP=2 (log-probs and one step)."""
    out = {}
    batch = make_batch()

    # -- TP=2 ------------------------------------------------------------------------------
    backend = _megatron(tensor_model_parallel_size=2)
    out["tp_sizes"] = (backend.tp_size, backend.dp_size, backend.pp_size)
    out["logits"] = backend.logits(batch)
    out.update(run_training(backend, batch))
    out["trained"] = backend.export_weights()
    backend.load_state_dict(tp1_checkpoint)  # written at TP=1: the checkpoint is layout-independent
    replay = make_loss_fn(batch, tp1_old, advantages_for(batch), float(batch.response_mask.sum()))
    out["resumed_step"] = backend.train_step(batch, replay, micro_batch_size=MICRO)
    out["after_resumed"] = backend.export_weights()
    del backend
    _reset_parallel_state()

    # -- DP=2, uneven shards (5 and 3 rows) ----------------------------------------------------
    backend = _megatron()
    out["dp_sizes"] = (backend.tp_size, backend.dp_size, backend.pp_size)
    rows = slice(0, 5) if backend.dp_rank == 0 else slice(5, 8)
    shard = batch.select(rows)
    old = backend.compute_log_probs(shard).log_probs
    old_full = torch.zeros_like(batch.response_mask, dtype=torch.float32)
    old_full[rows] = old
    dist.all_reduce(old_full, group=backend.dp_group)  # every rank's old log-probs, for the reference
    adv = advantages_for(batch)
    total_tokens = float(batch.response_mask.sum())
    loss_fn = make_loss_fn(shard, old, adv[rows], total_tokens)
    backend.accumulate_gradients(shard, loss_fn, micro_batch_size=2)
    out["dp_sum_grads"] = backend.gradients()
    backend.dp_grad_reduction = "mean"
    backend.accumulate_gradients(shard, loss_fn, micro_batch_size=2)
    out["dp_mean_grads"] = backend.gradients()
    local = _plain_gradients(initial_weights(), shard, loss_fn)
    gathered = [None, None]
    dist.all_gather_object(gathered, local, group=backend.dp_group)
    out["per_rank_grads"] = gathered
    out["full_batch_grads"] = _plain_gradients(
        initial_weights(), batch, make_loss_fn(batch, old_full, adv, total_tokens)
    )
    out["advantages"] = _gdpo_on_actor(backend)
    del backend
    _reset_parallel_state()

    # -- PP=2 --------------------------------------------------------------------------------
    backend = _megatron(pipeline_model_parallel_size=2)
    out["pp_sizes"] = (backend.tp_size, backend.dp_size, backend.pp_size)
    out["pp_run"] = run_training(backend, batch, micro=2)
    out["pp_trained"] = backend.export_weights()
    return out


GDPO_SEGMENTS = (6, 5, 1, 4)  # mini-batch sizes of one rollout; the 1-sample one leaves rank 1 empty


def gdpo_rollout():
    """Normalized GDPO rewards of a 16-sample rollout (groups of 4, two components), and a mask."""
    algorithm = GDPO(AlgorithmConfig(n_samples_per_prompt=4, reward_keys=("correct", "length"), reward_weights=(1.0, 0.5)))
    g = torch.Generator().manual_seed(11)
    raw = torch.stack([torch.randint(0, 2, (16,), generator=g).float(), torch.rand(16, generator=g) * 10], dim=1)
    raw[4:8, 0] = 1.0  # one group constant in a component
    group_ids = torch.arange(16) // 4
    rewards = algorithm.normalize_rewards(raw, group_ids)
    lengths = torch.randint(1, 6, (16,), generator=g)
    mask = torch.arange(6)[None, :] < lengths[:, None]
    return algorithm, rewards, mask


def _shard_minibatches(segment_sizes, dp_size: int) -> list[tuple[list[int], tuple[int, ...]]]:
    """Each mini-batch (consecutive rows) split over ``dp_size`` ranks as evenly as possible: per rank
    ``(row indices, its segment sizes)``; a rank may hold 0 rows of a mini-batch (size 0 listed)."""
    shards = [([], []) for _ in range(dp_size)]
    start = 0
    for size in segment_sizes:
        base, extra = divmod(size, dp_size)
        for rank in range(dp_size):
            n = base + (1 if rank < extra else 0)
            shards[rank][0].extend(range(start, start + n))
            shards[rank][1].append(n)
            start += n
    return [(rows, tuple(sizes)) for rows, sizes in shards]


def _gdpo_on_actor(backend) -> dict:
    from relax.algorithms import AdvantageInputs

    algorithm, rewards, mask = gdpo_rollout()
    rows, sizes = _shard_minibatches(GDPO_SEGMENTS, backend.dp_size)[backend.dp_rank]
    inputs = AdvantageInputs(rewards=rewards[rows], response_mask=mask[rows], segment_sizes=sizes)
    adv, ret = algorithm.compute_advantages(inputs, process_group=backend.dp_group)
    return {"rows": rows, "segment_sizes": sizes, "advantages": adv, "returns": ret}


def optimizer_flags(rank: int, world: int) -> dict:
    """Both backends built by ``for_policy`` from one ``RunConfig`` with weight decay, Adam flags and a
    warm-up + cosine schedule; and a zero-gradient step that leaves only the decoupled decay."""
    from relax.algorithms.types import PolicyLossOutput
    from relax.backends.megatron.backend import MegatronBackend
    from relax.backends.torch_backend import TorchBackend
    from relax.config.run import RunConfig

    def model():
        m = TinyCausalLM(CFG)
        m.load_state_dict(initial_weights())
        return m

    config = RunConfig(lr=LR, min_lr=1e-3, lr_warmup_steps=1, lr_decay_style="cosine", num_rollout=2,
                       num_steps_per_rollout=2, weight_decay=0.1, adam_beta1=0.8, adam_beta2=0.95,
                       adam_eps=ADAM_EPS, clip_grad=1.0, seed=7, micro_batch_size=MICRO)
    batch = make_batch()
    out = {}
    mg = MegatronBackend.for_policy(config, model())
    out["megatron"] = run_training(mg, batch, steps=4)["metrics"]
    out["megatron_trained"] = mg.export_weights()
    pt = TorchBackend.for_policy(config, model())
    out["torch"] = run_training(pt, batch, steps=4)["metrics"]
    out["torch_trained"] = pt.export_weights()

    def zero_loss(lp, rows):
        return PolicyLossOutput(loss=(lp.log_probs * 0.0).sum(), metrics={})

    decay = MegatronBackend(CFG, initial_weights=initial_weights(), lr=0.1, weight_decay=0.5, clip_grad=0.0, seed=7)
    decay.train_step(batch, zero_loss)
    out["decayed"] = decay.export_weights()
    return out


@contextlib.contextmanager
def counting_recomputed_forwards():
    """Counts megatron-core's recomputing (checkpointed) block forwards while active; yields the list
    that grows by one per call."""
    from megatron.core.transformer.transformer_block import TransformerBlock

    calls = []
    original = TransformerBlock._checkpointed_forward

    def counting(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    TransformerBlock._checkpointed_forward = counting
    try:
        yield calls
    finally:
        TransformerBlock._checkpointed_forward = original


def recompute(rank: int, world: int) -> dict:
    """The same training with and without ``--recompute-activations`` (full-layer recomputation)."""
    batch = make_batch()
    out = {}
    plain = _megatron()
    out["plain"] = run_training(plain, batch)["metrics"]
    out["plain_trained"] = plain.export_weights()
    from relax.backends.megatron.backend import MegatronBackend
    from relax.config.run import RunConfig

    model = TinyCausalLM(CFG)
    model.load_state_dict(initial_weights())
    config = RunConfig(lr=LR, adam_eps=ADAM_EPS, clip_grad=1.0, seed=7, recompute_activations=True)
    with counting_recomputed_forwards() as calls:
        recomputed = MegatronBackend.for_policy(config, model)  # the flag as `relax train` passes it
        out["recompute"] = run_training(recomputed, batch)["metrics"]
        out["recompute_trained"] = recomputed.export_weights()
    out["checkpointed_calls"] = len(calls)
    return out
