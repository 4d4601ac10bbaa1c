"""The Megatron backend as an optional extra: these run without megatron-core (no megatron mark)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_missing_megatron_core_names_the_extra(monkeypatch):
    from relax.backends.megatron import MegatronNotInstalled, load_megatron_backend

    monkeypatch.setitem(sys.modules, "megatron", None)  # makes `import megatron.core` fail
    monkeypatch.setitem(sys.modules, "megatron.core", None)
    with pytest.raises(MegatronNotInstalled, match=r"pip install 'relax-rl\[megatron\]'"):
        load_megatron_backend()


def test_untested_megatron_version_is_refused_not_patched():
    from relax.backends.megatron._cpu_compat import UnsupportedMegatronVersion, check_version

    assert check_version("0.16.1") == "0.16.1"
    for version in ("0.19.2", "0.15.0", "1.16.0"):
        with pytest.raises(UnsupportedMegatronVersion, match=f"megatron-core {version} has not been tested"):
            check_version(version)


@pytest.mark.timeout(60)
def test_importing_the_package_does_not_import_megatron_or_patch_torch():
    code = (
        "import sys, torch; before = torch.cuda.current_device\n"
        "import relax.backends.megatron, relax.backends.registry\n"
        "assert not any(m == 'megatron' or m.startswith('megatron.') for m in sys.modules), 'megatron imported'\n"
        "assert torch.cuda.current_device is before, 'torch.cuda patched at import'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
