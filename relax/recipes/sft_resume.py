"""Stopping ``relax sft`` cleanly (Ctrl-C, SIGTERM) and continuing it (``relax sft --load``).

A stop request lets the step in progress finish — an optimizer step cut in half would leave weights
no checkpoint can describe — then ``relax.recipes.sft`` saves that step and raises ``SftInterrupted``.
A second signal stops at once, without saving.

A resumed run must see the batches the uninterrupted run would have seen: every epoch's order is
drawn from ``(--seed, epoch)`` and cut into ``--batch-size`` batches (``epoch_batches``), so the
checkpoint records the data file's SHA-256, the batch size and the seed (in its ``sft.json``), and a
``--load`` that differs in any of them is refused before a model is built. ``state.pt`` also holds
torch's random state, so that whatever draws from it (dropout, evaluation sampling) continues as well.
"""

from __future__ import annotations

import hashlib
import signal
import threading
from pathlib import Path
from typing import Self

import torch

from relax.models.initial_weights import sft_checkpoint
from relax.runtime.files.checkpoint_files import CheckpointError

# The settings that fix which demonstrations each step trains on: (marker key, flag).
SAME_DATA_ORDER = (("data_sha256", "--data"), ("batch_size", "--batch-size"), ("seed", "--seed"))


def data_fingerprint(path: str | Path) -> str:
    """The SHA-256 of the demonstrations file: the same contents under another name still resume."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def order_settings(config, sft, fingerprint: str) -> dict:
    """What ``sft.json`` records so that ``--load`` can check the data order (``SAME_DATA_ORDER``)."""
    return {"data": str(sft.data), "data_sha256": fingerprint, "batch_size": sft.batch_size, "seed": config.seed}


def check_resume(config, sft, fingerprint: str) -> int:
    """``config.load`` (``--load``) -> the step it continues from; raises ``CheckpointError`` naming the
    flag when it is no ``relax sft`` checkpoint, or one of other data, batch size or seed."""
    load = config.load
    marker = sft_checkpoint(load)
    if marker is None:
        raise CheckpointError(f"--load {load}: not a relax sft checkpoint (no sft.json in its step directory); "
                              "a relax train run continues with relax train --load")
    if "data_sha256" not in marker:
        raise CheckpointError(f"--load {load}: the checkpoint does not record its data order (written by an "
                              "older relax sft), so it cannot be continued; start a new run")
    ours = order_settings(config, sft, fingerprint)
    if marker["data_sha256"] != ours["data_sha256"]:
        raise CheckpointError(
            f"--load {load}: --data {sft.data} is not the file the checkpoint trained on ({marker['data']}, whose "
            "contents differ); the resumed run must see the same batches, so pass --data with that file's contents, "
            "or start a new run without --load")
    for key, flag in SAME_DATA_ORDER[1:]:
        if marker[key] != ours[key]:
            raise CheckpointError(
                f"--load {load}: {flag} {ours[key]} differs from the checkpoint's {flag} {marker[key]}; the resumed "
                f"run must see the same batches, so pass {flag} {marker[key]}, or start a new run without --load")
    if marker["step"] >= config.num_rollout:
        raise CheckpointError(f"--load {load}: its step {marker['step']} already completes this run's "
                              f"{config.num_rollout} steps; raise --num-epochs to train further")
    return int(marker["step"])


def rng_state() -> dict:
    return {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def restore_rng(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class SftInterrupted(KeyboardInterrupt):
    """The run stopped on a signal after saving its last finished step (``signum``: which)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class StopRequests:
    """While entered: SIGINT and SIGTERM (and SIGHUP unless ignored, as with ``nohup``) only set
    ``signum``; the training loop stops after the step in progress. A second one raises
    ``KeyboardInterrupt`` at once. Off the main thread (where handlers cannot be set) it does nothing."""

    def __init__(self, on_first=None):
        self.signum: int | None = None
        self.on_first = on_first  # called with the signal number on the first request (a log line)
        self._previous: dict = {}

    def __enter__(self) -> Self:
        if threading.current_thread() is threading.main_thread():
            signals = [signal.SIGINT, signal.SIGTERM]
            if signal.getsignal(signal.SIGHUP) == signal.SIG_DFL:
                signals.append(signal.SIGHUP)
            self._previous = {s: signal.signal(s, self._handle) for s in signals}
        return self

    def _handle(self, signum, frame):
        if self.signum is not None:
            self.__exit__()
            raise KeyboardInterrupt
        self.signum = signum
        if self.on_first is not None:
            self.on_first(signum)

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}
