"""Single-process RL training on a built-in task: no Ray, no data plane, one thread.

One step is what the Ray pipeline does, in one process and in this order:

1. sample ``n_samples`` completions for each of ``prompts_per_step`` prompts with ``TinyEngine``;
2. score every completion with the task's reward function -> the raw ``[N, K]`` reward matrix
   (columns in ``AlgorithmConfig.reward_keys`` order);
3. drop groups that carry no signal for the algorithm (``group_has_signal``);
4. ``normalize_rewards`` -> ``compute_advantages`` with one segment per optimizer mini-batch
   (mini-batches are whole prompt groups);
5. old log-probs once, then one ``TorchBackend.train_step`` per mini-batch with ``policy_loss``;
6. push the new weights to the engine.

Every step logs each component's mean (all of the task's components, also those the algorithm does
not train on), optionally the algorithm's ``reward_diagnostics`` computed
on the whole rollout *before* the group filter (dropped samples count with advantage 0), the
fraction of samples kept, the averaged training metrics and timings. At the end the greedy accuracy
on all 100 addition problems is measured.

The run is a pure function of its arguments: the model starts from the shipped warm-up checkpoint,
the prompt stream and the sampling generator are seeded with ``seed``, and with one thread the CPU
kernels are deterministic, so the same arguments give bit-identical metrics (timings aside).

    from relax.rollout.tasks import get_task
    from relax.recipes.local_loop import recipe_config, train_local

    task = get_task("addition-brevity")
    config = recipe_config(task.reward_keys, reward_weights=(1, 1, 1, 1, 10))
    result = train_local(task, "gdpo", config, steps=600, seed=0)
    result.history[-1]["reward/correct/mean"], result.greedy_accuracy
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping

import torch

from relax.algorithms import AdvantageInputs, AlgorithmConfig, RLAlgorithm
from relax.algorithms.types import check_normalized_rewards
from relax.backends.torch_backend import TorchBackend
from relax.models.batch import TokenBatch
from relax.models.tiny.weights import load_warmup_model
from relax.recipes.local_recipe import (
    LocalRunResult,
    check_scales,
    check_shapes,
    recipe_config,
    resolve_algorithm,
)
from relax.rollout.base import SamplingParams
from relax.rollout.sampling import sample_groups
from relax.rollout.tasks import Task, get_task
from relax.rollout.tasks.addition import greedy_accuracy
from relax.rollout.tiny.engine import TinyEngine
from relax.runtime.losses import policy_loss_fn
from relax.runtime.rollout_worker import filter_groups as keep_groups_with_signal
from relax.runtime.schedule import plan_step, segment_slices

# Per-step keys that depend on wall time, so they are excluded when comparing two runs.
TIMING_PREFIX = "time/"


@contextlib.contextmanager
def _torch_threads(num_threads: int | None):
    """Run with ``num_threads`` torch intra-op threads (None: leave the setting alone), then restore."""
    previous = torch.get_num_threads()
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def train_local(
    task: Task | str,
    algorithm: str | RLAlgorithm,
    config: AlgorithmConfig | None = None,
    *,
    steps: int = 600,
    seed: int = 0,
    prompts_per_step: int = 32,
    n_samples: int = 8,
    num_minibatches: int = 2,
    lr: float = 3e-4,
    clip_grad: float = 1.0,
    temperature: float = 1.0,
    filter_groups: bool = True,
    diagnostics: bool = True,
    evaluate: bool = True,
    reward_scales: Mapping[str, float] | None = None,
    num_threads: int | None = 1,
    log_every: int = 0,
    on_step: Callable[[dict[str, float]], None] | None = None,
) -> LocalRunResult:
    """Train the shipped warm-up model on ``task`` for ``steps`` rollouts in this process.

    Args:
        task: a built-in ``Task`` or its name (``get_task``).
        algorithm: a registered name / ``module:Class`` spec (then ``config`` is required), or an
            ``RLAlgorithm`` instance.
        config: the algorithm's configuration; its ``reward_keys`` must be components of the task
            and its ``n_samples_per_prompt`` must equal ``n_samples``.
        steps: rollouts (each followed by ``num_minibatches`` optimizer steps).
        seed: seeds the prompt stream and the sampling generator.
        prompts_per_step, n_samples: the batch shape (prompt groups x group size).
        num_minibatches: optimizer steps per rollout; each mini-batch is whole prompt groups.
        lr, clip_grad, temperature: AdamW learning rate, gradient-norm clip, sampling temperature.
        filter_groups: drop groups without signal for the algorithm, as the pipeline does.
        diagnostics: add ``algorithm.reward_diagnostics`` (``reward/*``, ``multi_reward/*``,
            ``advantage/*``, and e.g. GDPO's ``gdpo/*``) to every step (needs >= 1 reward key;
            multi-reward keys need >= 2).
        evaluate: measure the greedy accuracy on the 100 addition problems at the end.
        reward_scales: ``{component: factor}`` multiplying that component's raw value before the
            algorithm sees it, i.e. a reward function that reports it on a different scale (unlike
            ``reward_weights``, which GDPO applies *after* its per-component normalization). The
            ``reward/<key>/*`` metrics stay in the task's units; the ``multi_reward/*``, ``gdpo/*``
            and ``advantage/*`` diagnostics see the scaled rewards the algorithm trains on.
        num_threads: torch intra-op threads for the run (restored afterwards); ``None`` leaves the
            setting alone. One thread is deterministic and robust on a loaded machine.
        log_every: print a progress line every that many steps (0: silent).
        on_step: called with each step's metrics dict as soon as it is complete.
    """
    task = get_task(task) if isinstance(task, str) else task
    algorithm = resolve_algorithm(algorithm, config)
    check_shapes(algorithm, task, n_samples, prompts_per_step, num_minibatches, steps)
    scales = check_scales(reward_scales, task)
    with _torch_threads(num_threads):
        config = algorithm.config
        keys = tuple(config.reward_keys)
        components = tuple(task.reward_keys)
        columns = [components.index(k) for k in keys]
        scale_row = torch.tensor([scales.get(k, 1.0) for k in keys], dtype=torch.float64)

        torch.manual_seed(seed)
        model = load_warmup_model()
        engine = TinyEngine(load_warmup_model(), task.make_tokenizer())
        backend = TorchBackend(model, lr=lr, clip_grad=clip_grad, temperature=temperature)
        engine.load_weights(backend.export_weights())
        prompt_source = task.make_prompts(seed)
        generator = torch.Generator().manual_seed(seed)
        params = SamplingParams(temperature=temperature, max_new_tokens=task.max_new_tokens)
        group_ids = torch.arange(prompts_per_step).repeat_interleave(n_samples)

        history: list[dict[str, float]] = []
        start = time.perf_counter()
        for step in range(1, steps + 1):
            t0 = time.perf_counter()
            scored = sample_groups(engine, prompt_source.next_batch(prompts_per_step), n_samples, params,
                                   generator=generator, reward_fn=task.reward_fn, reward_keys=components)
            gen, all_rewards = scored.generation, scored.rewards
            raw = all_rewards[:, columns]
            rewards = (raw * scale_row).to(torch.float32) if scales else raw.to(torch.float32)
            t_rollout = time.perf_counter() - t0

            record: dict[str, float] = {"step": step}
            for j, k in enumerate(components):
                record[f"reward/{k}/mean"] = float(all_rewards[:, j].mean())

            keep = (
                keep_groups_with_signal(algorithm, rewards, group_ids)
                if filter_groups
                else torch.ones(len(all_rewards), dtype=torch.bool)
            )
            record["response/tokens_mean"] = float(gen.batch.response_mask.sum(1).double().mean())
            record["kept_frac"] = float(keep.float().mean())
            per_sample_advantage = torch.zeros(len(all_rewards), dtype=torch.float64)
            if keep.any():
                train_metrics = _train_on_kept(
                    algorithm, backend, gen.batch, rewards, group_ids, keep, num_minibatches, per_sample_advantage,
                    task.max_new_tokens,
                )
                record.update({f"train/{k}": v for k, v in train_metrics.items()})
                engine.load_weights(backend.export_weights())
            if diagnostics:
                record.update(algorithm.reward_diagnostics(rewards, group_ids, per_sample_advantage))
                if scales:  # per-component statistics in the task's units
                    # float32 like the unscaled path, so a scale of 1 and no scale log the same numbers
                    unscaled = algorithm.reward_diagnostics(raw.to(torch.float32), group_ids)
                    record.update({k: v for k, v in unscaled.items() if k.startswith("reward/")})
            record["time/step_s"] = time.perf_counter() - t0
            record["time/rollout_s"] = t_rollout
            history.append(record)
            if on_step is not None:
                on_step(record)
            if log_every and step % log_every == 0:
                rate = step / (time.perf_counter() - start)
                print(
                    f"step {step:4d}  "
                    + "  ".join(f"{k}={record[f'reward/{k}/mean']:.3f}" for k in components)
                    + f"  {rate:.1f} steps/s",
                    flush=True,
                )
        seconds = time.perf_counter() - start
        accuracy = greedy_accuracy(engine, task) if evaluate else None
        return LocalRunResult(
            history=history,
            greedy_accuracy=accuracy,
            seconds=seconds,
            reward_keys=keys,
            reward_weights=tuple(config.reward_weights),
            task_components=components,
        )


def _train_on_kept(
    algorithm: RLAlgorithm,
    backend: TorchBackend,
    batch: TokenBatch,
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    keep: torch.Tensor,
    num_minibatches: int,
    per_sample_advantage: torch.Tensor,
    max_response_length: int,
) -> dict[str, float]:
    """Advantages + one optimizer step per mini-batch on the kept rows; returns the averaged train
    metrics and writes each kept sample's mean token advantage into ``per_sample_advantage``."""
    rows = keep.nonzero().squeeze(1)
    kept: TokenBatch = batch.select(rows)
    kept_ids = group_ids[rows]
    scalar = algorithm.normalize_rewards(rewards[rows], kept_ids)
    check_normalized_rewards(algorithm, scalar, kept_ids.shape)
    # Mini-batches are whole prompt groups, planned as the Ray pipeline plans them.
    group_size = len(kept_ids) // len(kept_ids.unique_consecutive())
    group_tokens = kept.response_mask.sum(1).view(-1, group_size).sum(1).tolist()
    plan = plan_step(kept_ids.unique_consecutive().tolist(), group_tokens, group_size, num_minibatches, 1)
    sizes = plan.segment_sizes
    advantages, _ = algorithm.compute_advantages(
        AdvantageInputs(rewards=scalar, response_mask=kept.response_mask, segment_sizes=sizes)
    )
    mask = kept.response_mask.to(torch.float64)
    per_sample_advantage[rows] = (advantages.to(torch.float64) * mask).sum(1) / mask.sum(1).clamp_min(1.0)
    old = backend.compute_log_probs(kept).log_probs
    sums: dict[str, float] = {}
    for part in segment_slices(sizes):
        mini = kept.select(part)
        loss_fn = policy_loss_fn(
            algorithm, old_log_probs=old[part], advantages=advantages[part], response_mask=mini.response_mask,
            global_num_tokens=float(mini.response_mask.sum()), global_num_sequences=float(len(mini)),
            max_response_length=max_response_length,
        )
        for name, value in backend.train_step(mini, loss_fn).items():
            sums[name] = sums.get(name, 0.0) + float(value)
    return {name: value / len(sizes) for name, value in sums.items()}


__all__ = ["TIMING_PREFIX", "LocalRunResult", "greedy_accuracy", "recipe_config", "train_local"]
