"""Loading the Megatron backend prints none of megatron-core's CPU-fallback notes ("Transformer Engine
and Apex are not installed. Falling back to ..."), which filled half of a Megatron run's output."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.megatron
pytest.importorskip("megatron.core", reason="megatron-core is not installed")

LOAD = (
    "import warnings; warnings.simplefilter('always', UserWarning)\n"
    "from relax.backends.megatron import load_megatron_backend\n"
    "print(load_megatron_backend().__name__)\n"
)


def test_loading_the_backend_prints_no_fallback_notes():
    done = subprocess.run([sys.executable, "-c", LOAD], capture_output=True, text=True, timeout=300, check=True)
    assert done.stdout.strip() == "MegatronBackend"
    assert "not installed" not in done.stderr and "Falling back" not in done.stderr, done.stderr
