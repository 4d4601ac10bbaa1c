"""Keep TransferQueue's import from paying for ``torch._dynamo``.

TransferQueue imports tensordict, and tensordict decorates a few functions at import with
``torch.compiler.allow_in_graph`` and ``torch.compiler.assume_constant_result``; both import
``torch._dynamo`` first, which costs 1.2-1.3 s of CPU. Every process of a run imports TransferQueue
(the driver, the TransferQueue controller and storage unit, each rollout worker and actor rank), so
on a 2-core machine this alone was about 3 s of a cold start-up. relax never compiles tensordict's
code, but a user's torch.compile might, so nothing is dropped, only deferred:

- ``assume_constant_result`` only sets ``fn._dynamo_marked_constant`` (what torch does itself);
- ``allow_in_graph`` registrations are queued and made the moment ``torch._dynamo`` is imported
  (by ``torch.compile`` or anything else), or at once when it already is.

``install()`` runs in the driver before TransferQueue is imported and, through Ray's
``worker_process_setup_hook``, in every worker process of the run. It imports nothing heavy.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

HOOK = "relax.runtime.data.lazy_dynamo.install"  # for Ray's runtime_env worker_process_setup_hook

_pending: list = []  # functions tensordict asked to allow in graph before torch._dynamo was imported


def _allow_in_graph(fn):
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None and hasattr(dynamo, "allow_in_graph"):
        return dynamo.allow_in_graph(fn)
    _pending.append(fn)
    return fn


def _assume_constant_result(fn):
    fn._dynamo_marked_constant = True  # exactly torch._dynamo.assume_constant_result's effect
    return fn


class _Wrapped(importlib.abc.Loader):
    """A module's own loader, with code run before and after its module executes."""

    def __init__(self, inner, before, after):
        self.inner, self.before, self.after = inner, before, after

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def __getattr__(self, name):  # get_resource_reader, is_package, ...: the module's own loader's
        return getattr(self.inner, name)

    def exec_module(self, module):
        state = self.before()
        try:
            self.inner.exec_module(module)
        finally:
            self.after(state)


def _patch_compiler():
    from torch import compiler

    real = compiler.allow_in_graph, compiler.assume_constant_result
    compiler.allow_in_graph, compiler.assume_constant_result = _allow_in_graph, _assume_constant_result
    return real


def _restore_compiler(real) -> None:
    from torch import compiler

    compiler.allow_in_graph, compiler.assume_constant_result = real


def _register_pending(_state=None) -> None:
    dynamo = sys.modules.get("torch._dynamo")
    while _pending and dynamo is not None:
        dynamo.allow_in_graph(_pending.pop())


class _Finder(importlib.abc.MetaPathFinder):
    """Wraps the loaders of ``tensordict`` (patch while it imports) and ``torch._dynamo``
    (register what was queued once it has imported)."""

    def find_spec(self, name, path, target=None):
        if name == "tensordict":
            before, after = _patch_compiler, _restore_compiler
        elif name == "torch._dynamo":
            before, after = (lambda: None), _register_pending
        else:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _Wrapped(spec.loader, before, after)
        return spec


def install() -> None:
    """Idempotent; a no-op when tensordict is already imported (its decorations already ran)."""
    if "tensordict" in sys.modules or any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _Finder())
