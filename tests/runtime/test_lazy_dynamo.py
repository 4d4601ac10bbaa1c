"""TransferQueue imported without torch._dynamo (relax.runtime.data.lazy_dynamo), and nothing lost:
tensordict's registrations are made once torch._dynamo is imported."""

from __future__ import annotations

import subprocess
import sys

import pytest

CHECK = """
import sys
from relax.runtime.data import lazy_dynamo
lazy_dynamo.install()
import transfer_queue  # imports tensordict
assert "torch._dynamo" not in sys.modules, "transfer_queue's import pulled in torch._dynamo"
queued = list(lazy_dynamo._pending)
assert queued, "tensordict asked for no allow_in_graph: the hook saw nothing"
import tensordict.base, tensordict.utils
assert tensordict.utils._lock_warn._dynamo_marked_constant is True
import torch._dynamo
from torch._dynamo import trace_rules
assert not lazy_dynamo._pending
assert all(id(fn) in trace_rules._allowed_callable_ids for fn in queued)
assert id(tensordict.base._foreach_copy_compiled) in trace_rules._allowed_callable_ids
print("ok", len(queued))
"""


def test_transfer_queue_imports_without_dynamo_and_registers_later():
    done = subprocess.run([sys.executable, "-c", CHECK], check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("ok ")


def test_without_the_hook_tensordict_imports_dynamo():
    """The reference: what the hook saves is real (if tensordict stops importing dynamo, the hook
    can go)."""
    code = "import sys, transfer_queue; print('torch._dynamo' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "True", done.stderr[-2000:]


@pytest.mark.timeout(120)
def test_ray_workers_of_a_run_get_the_hook(ray_cluster):
    import ray

    @ray.remote(num_cpus=0)
    def imports_dynamo() -> bool:
        import transfer_queue  # noqa: F401

        return "torch._dynamo" in sys.modules

    assert ray.get(imports_dynamo.remote(), timeout=100) is False
