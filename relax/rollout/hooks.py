"""The reward hooks a user plugs into the rollout, called with their contracts checked.

``--dynamic-sampling-filter-path``: ``keep_filter(rewards, group_ids, samples, keep) -> bool [N]``
decides which prompt groups the rollout keeps (``keep`` is the algorithm's own verdict); the result
must be constant within a group. ``--custom-reward-post-process-path``: ``post_process(rewards,
group_ids, samples) -> float32 [N]`` replaces the method's reward normalization. ``rewards`` is the
float64 ``[N, K]`` matrix in ``--reward-keys`` order, ``samples`` one dict per sample (prompt,
completion, label, metadata). A hook that raises, exits (``sys.exit``), breaks its contract or runs
longer than ``--hook-timeout`` stops the run with a ``HookError`` naming the flag, the function and
the step (docs/en/hooks.md).
"""

from __future__ import annotations

import threading

import torch

POST_PROCESS_FLAG = "--custom-reward-post-process-path"
FILTER_FLAG = "--dynamic-sampling-filter-path"


class HookError(ValueError):
    """A user hook (``--custom-reward-post-process-path``, ``--dynamic-sampling-filter-path``) raised or
    returned something outside its contract; the message names the flag, the function and the step."""


# The positional arguments each hook is called with (docs/en/hooks.md).
HOOK_ARGUMENTS = {
    FILTER_FLAG: ("rewards", "group_ids", "samples", "keep"),
    POST_PROCESS_FLAG: ("rewards", "group_ids", "samples"),
}


def check_hook_signature(fn, flag: str, spec: str) -> None:
    """Refuse a hook that cannot be called with its arguments (``HOOK_ARGUMENTS[flag]``), before any
    worker starts, as ``--custom-rm-path`` is refused."""
    import inspect

    arguments = HOOK_ARGUMENTS[flag]
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins without a signature: nothing to check
        return
    try:
        signature.bind(*arguments)
    except TypeError as exc:
        name = getattr(fn, "__qualname__", repr(fn))
        raise HookError(
            f"{flag} {spec!r}: {name} must accept ({', '.join(arguments)}); its signature is {signature} ({exc})"
        ) from None


def _hook_name(flag: str, spec: str, step: int) -> str:
    return f"{flag} {spec!r} (step {step})"


def _run_with_deadline(fn, args: tuple, timeout: float | None, where: str):
    """``fn(*args)``; with a ``timeout`` (seconds) in a daemon thread that is abandoned when it runs
    longer (Python cannot stop a thread; the run ends anyway)."""
    if not timeout:
        return fn(*args)
    outcome: dict = {}

    def target():
        try:
            outcome["value"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=target, name="relax-hook", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise HookError(f"{where} did not return within --hook-timeout {timeout:g}s; make the hook faster, or "
                        "raise --hook-timeout (0: no limit)")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _call(fn, where: str, n: int, dtype: torch.dtype, contract: str, hint: str, *args,
          timeout: float | None = None) -> torch.Tensor:
    """``fn(*args)`` (tensors passed as copies), checked to be a ``dtype`` tensor of shape ``(n,)``."""
    try:
        out = _run_with_deadline(fn, tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args),
                                 timeout, where)
    except HookError:
        raise
    except SystemExit as exc:  # a hook that exits fails like one that raises, and says so
        raise HookError(f"{where} called sys.exit({exc.code!r}) (SystemExit), which would end the rollout "
                        "worker's process; a hook returns its tensor, or raises") from exc
    except Exception as exc:
        raise HookError(f"{where} raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(out, torch.Tensor) or out.dtype != dtype or tuple(out.shape) != (n,):
        got = f"a {out.dtype} tensor of shape {tuple(out.shape)}" if isinstance(out, torch.Tensor) else (
            f"a {type(out).__name__}")
        kind = str(dtype).removeprefix("torch.")
        raise HookError(
            f"{where} returned {got}; {contract} must return a {kind} tensor of shape ({n},), {hint}"
        )
    return out


def call_keep_filter(fn, spec: str, step: int, rewards, group_ids, samples, keep,
                     timeout: float | None = None) -> torch.Tensor:
    """``keep_filter(rewards, group_ids, samples, keep)`` -> checked bool ``[N]``, constant per group."""
    where = _hook_name(FILTER_FLAG, spec, step)
    out = _call(fn, where, group_ids.shape[0], torch.bool, "keep_filter(rewards, group_ids, samples, keep)",
                "one entry per sample (e.g. keep & my_condition)", rewards, group_ids, samples, keep, timeout=timeout)
    for g in torch.unique(group_ids).tolist():
        member = out[group_ids == g]
        if bool(member.any()) and not bool(member.all()):
            first = int((group_ids == g).nonzero()[0, 0])
            raise HookError(
                f"{where} kept only part of prompt group {g} (samples from {first}: {member.tolist()}); "
                "it must keep or drop whole groups: return the same value for every sample of a group"
            )
    return out


def call_post_process(fn, spec: str, step: int, rewards, group_ids, samples,
                      timeout: float | None = None) -> torch.Tensor:
    """``post_process(rewards, group_ids, samples)`` -> checked finite float32 ``[N]``."""
    where = _hook_name(POST_PROCESS_FLAG, spec, step)
    out = _call(fn, where, group_ids.shape[0], torch.float32, "post_process(rewards, group_ids, samples)",
                "one scalar per sample (e.g. my_values.float())", rewards, group_ids, samples, timeout=timeout)
    bad = ~torch.isfinite(out)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise HookError(
            f"{where} returned {int(bad.sum())} non-finite value(s), the first at sample {i}: {out[i].item()}"
        )
    return out
