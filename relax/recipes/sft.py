"""``relax sft``: supervised fine-tuning on demonstrations, with ``relax train``'s own pieces.

The model comes from the run's factory (the built-in model's warm-up, or ``--hf-checkpoint``), and
trains through the ``TrainingBackend`` of ``--backend`` (``for_policy``: the same optimizer, learning-
rate schedule, ``--bf16``, ``--lora-rank``, ``--max-tokens-per-micro-batch`` packing and
``--micro-batch-size`` as ``relax train``'s actor), one rank in this process. Each optimizer step takes
``--batch-size`` demonstrations; the loss is the token mean of the negative log-likelihood of the
trained tokens (the completion, or the assistant turns) over the whole batch:

    loss = - sum_{i, t in trained} log p(y_it | context) / (number of trained tokens in the batch)

``metrics.jsonl`` rows carry ``sft/loss``, ``sft/tokens_per_s`` (real tokens, prompt included, per
second of training), ``sft/loss_tokens``, ``sft/grad_norm``, ``sft/lr``, ``sft/epoch`` and
``time/step_s``, and the ``eval/*`` metrics of ``relax train``'s evaluation (``relax.recipes.sft_eval``)
before training, every ``--eval-interval`` steps and after the last; the trackers get every row.
Checkpoints: ``relax.recipes.sft_checkpoint``; stopping on a signal and ``--load``:
``relax.recipes.sft_resume``.
"""

from __future__ import annotations

import random
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import attrs
import torch

from relax.algorithms.types import PolicyLossOutput
from relax.backends.registry import get_backend
from relax.config.output_dir import output_dir_of
from relax.config.sft import SftConfig, steps_per_epoch
from relax.models.batch import TokenBatch
from relax.models.factory import build_policy_model
from relax.recipes.sft_checkpoint import save_sft_checkpoint, saves_at
from relax.recipes.sft_resume import (
    SftInterrupted,
    StopRequests,
    check_resume,
    data_fingerprint,
    order_settings,
    restore_rng,
    rng_state,
)
from relax.rollout.sft_data import SftExample, sft_batch
from relax.runtime.files.checkpoint_files import read_checkpoint, superseded_warnings
from relax.runtime.files.console import log
from relax.runtime.files.metrics_log import MetricsLog
from relax.runtime.files.run_dir import lock_run_dir
from relax.runtime.files.trackers import Trackers


@attrs.frozen
class SftSummary:
    output_dir: Path
    checkpoint: Path  # the last checkpoint's directory
    rows: list[dict]  # the metrics.jsonl rows
    seconds: float


def sft_loss_fn(batch: TokenBatch, num_tokens: int) -> Callable:
    """The backend's ``loss_fn``: each micro-batch's share of the batch's token-mean NLL, so that the
    summed shares are the whole batch's (``num_tokens``: its trained tokens)."""

    def loss_fn(token_log_probs, rows) -> PolicyLossOutput:
        log_probs = token_log_probs.log_probs
        mask = batch.response_mask.to(log_probs.device)[rows]  # the loss mask; log-probs elsewhere are 0
        nll = -(log_probs * mask).sum() / num_tokens
        return PolicyLossOutput(loss=nll, metrics={"sft/loss": nll.detach()})

    return loss_fn


def epoch_batches(examples: Sequence[SftExample], sft: SftConfig, seed: int) -> Iterator[tuple[int, list]]:
    """``(epoch, demonstrations)`` per optimizer step: every epoch in a fresh order drawn from
    ``(seed, epoch)`` alone, cut into ``--batch-size`` batches."""
    for epoch in range(sft.num_epochs):
        order = list(range(len(examples)))
        random.Random(seed * 1_000_003 + epoch).shuffle(order)
        for start in range(0, len(order), sft.batch_size):
            yield epoch, [examples[i] for i in order[start : start + sft.batch_size]]


def total_steps(num_examples: int, sft: SftConfig) -> int:
    return sft.num_epochs * steps_per_epoch(num_examples, sft.batch_size)


def step_line(row: dict, total: int) -> str:
    """``--no-progress``'s line every ``--log-interval`` steps."""
    return (f"relax sft: step {row['step']}/{total} | loss {row['sft/loss']:.4f} | "
            f"{row['sft/tokens_per_s']:.0f} tokens/s | {row['time/step_s']:.2f} s/step")


def run_sft(config, sft: SftConfig, examples: Sequence[SftExample], pad_id: int) -> SftSummary:
    """Train on ``examples`` (``relax.rollout.sft_data``; ``pad_id``: the tokenizer's) with ``config``,
    a ``RunConfig`` whose ``num_rollout`` is the number of steps (``total_steps``). ``config.load``
    (``--load``): a ``relax sft`` checkpoint of the same data order to continue (``relax.recipes.sft_resume``).
    A signal stops the run after its step in progress, saved: ``SftInterrupted``."""
    t_start = time.perf_counter()
    out = output_dir_of(config)
    lock = lock_run_dir(out, resuming=config.load or False,  # noqa: F841 - held while this runs
                        overwrite=config.overwrite_output_dir)
    order = order_settings(config, sft, data_fingerprint(sft.data))
    start = check_resume(config, sft, order["data_sha256"]) if config.load else 0
    torch.manual_seed(config.seed)
    model = build_policy_model(config)
    tiny_config = None if config.hf_checkpoint else model.config
    backend = get_backend(config.backend).load().for_policy(config, model)
    if start:
        _, state = read_checkpoint(config.load)
        backend.load_state_dict(state["actor"]["backend"])
        restore_rng(state["sft"]["rng"])
        for warning in superseded_warnings(config.load, out, start):
            log(f"relax sft: warning: {warning}")
    evaluation = _evaluation(config)
    resume_after = start if config.load else None  # the log's rows and the trackers' steps after it are redone
    metrics_log = MetricsLog(out / "metrics.jsonl", resume_after_step=resume_after, warn=log)
    if evaluation is not None:  # the resumed run's before/after line starts from the first run's evaluation
        for kept in metrics_log.rows:
            if "eval/policy_version" in kept:
                evaluation.schedule.results[kept["step"]] = {k: v for k, v in kept.items() if k.startswith("eval/")}
    trackers = Trackers(config, out, resume_after_step=resume_after)
    total = config.num_rollout
    resumed = f"; resumed after step {start} of {config.load}" if start else ""
    log(f"relax sft: {len(examples)} demonstrations, {total} steps of {sft.batch_size} "
        f"({sft.num_epochs} epoch(s)); backend {config.backend}; output: {out}{resumed}")
    from tqdm import tqdm

    bar = tqdm(total=total, initial=start, desc="sft", unit="step", disable=not config.progress, file=sys.stderr,
               dynamic_ncols=True)
    rows, last, step, saved = [], None, start, start
    stop = StopRequests(on_first=lambda signum: log(
        f"relax sft: {signal.Signals(signum).name}: stopping after the step in progress, then saving it "
        "(interrupt again to stop at once, unsaved)", bar))
    try:
        with stop:
            if evaluation is not None and config.eval_before_train and not start:
                _log_row({"step": 0, **evaluation.run(0, backend.export_weights())}, metrics_log, trackers, rows,
                         evaluation, bar)
            for step, (epoch, demos) in enumerate(epoch_batches(examples, sft, config.seed), start=1):
                if step <= start:
                    continue  # trained before the checkpoint: only its place in the order matters
                if stop.signum is not None:
                    step -= 1
                    break
                row = {"step": step, **train_one_step(backend, sft_batch(demos, pad_id), config),
                       "sft/epoch": epoch + 1}
                if evaluation is not None and evaluation.schedule.due(step):
                    row.update(evaluation.run(step, backend.export_weights()))
                _log_row(row, metrics_log, trackers, rows, evaluation, bar)
                bar.update(1)
                bar.set_postfix_str(f"loss {row['sft/loss']:.4f}, {row['sft/tokens_per_s']:.0f} tokens/s",
                                    refresh=False)
                if not config.progress and (step % config.log_interval == 0 or step == total):
                    log(step_line(row, total))
                if saves_at(config, step):
                    last = save_sft_checkpoint(backend, config, out, step, tiny_config=tiny_config, order=order,
                                               rng=rng_state())
                    saved = step
            if stop.signum is not None and step < total:
                _save_on_stop(backend, config, out, step, saved, tiny_config, order, bar)
                raise SftInterrupted(stop.signum)
    finally:
        bar.close()
        trackers.close()
    summary = evaluation.schedule.summary_line() if evaluation is not None else None
    if summary:
        log(summary.replace("relax:", "relax sft:", 1))
    log(f"relax sft: {total} steps in {time.perf_counter() - t_start:.1f}s; model: {last}")
    return SftSummary(output_dir=out, checkpoint=last, rows=rows, seconds=time.perf_counter() - t_start)


def _save_on_stop(backend, config, out: Path, step: int, saved: int, tiny_config, order: dict, bar) -> None:
    """The stop request's save: the last finished step (unless saved already), and how to resume."""
    if step == 0:
        log("relax sft: no step finished training, so no model was saved", bar)
        return
    if step != saved:
        save_sft_checkpoint(backend, config, out, step, tiny_config=tiny_config, order=order, rng=rng_state())
    log(f"relax sft: saved step {step} to {out / 'checkpoints'} (resume with relax sft --load {out} and the same "
        "--data, --batch-size and --seed)", bar)


def train_one_step(backend, batch: TokenBatch, config) -> dict:
    """One optimizer step on ``batch``; its metrics."""
    t0 = time.perf_counter()
    num_tokens = int(batch.response_mask.sum())
    metrics = backend.train_step(batch, sft_loss_fn(batch, num_tokens), micro_batch_size=config.micro_batch_size,
                                 with_entropy=False)
    seconds = time.perf_counter() - t0
    real_tokens = int(batch.attention_mask.sum())
    return {"sft/loss": metrics["sft/loss"], "sft/loss_tokens": num_tokens, "sft/tokens_per_s": real_tokens / seconds,
            "sft/grad_norm": metrics["grad_norm"], "sft/lr": metrics["lr"], "time/step_s": seconds}


def _evaluation(config):
    from relax.recipes.sft_eval import SftEvaluation
    from relax.runtime.weights.weight_sync import ObjectStoreSync, publish_dtype

    evaluation = SftEvaluation(config, ObjectStoreSync(publish_dtype(config)))  # one engine, in this process
    return evaluation if evaluation.enabled else None


def _log_row(row: dict, metrics_log: MetricsLog, trackers: Trackers, rows: list, evaluation, bar) -> None:
    metrics_log.write(row)
    trackers.log(row)
    rows.append({k: v for k, v in row.items() if not k.startswith("_")})
    if "eval/policy_version" in row:
        log(evaluation.schedule.line(row).replace("relax:", "relax sft:", 1), bar)
