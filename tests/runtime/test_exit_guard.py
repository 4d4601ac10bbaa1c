"""``os._exit()`` in user code run by the rollout (a reward function, hook or environment) is named,
file, line and function, before the process ends with the status asked for; relax's and libraries'
own calls pass silently."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(tmp_path, body: str) -> subprocess.CompletedProcess:
    (tmp_path / "user_exits.py").write_text("import os\n\ndef reward(*args):\n    os._exit(3)\n")
    script = "from relax.runtime.step.exit_guard import guard_os_exit\nguard_os_exit()\n" + body
    return subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": f"{ROOT}:{tmp_path}"})


def test_user_code_calling_os_exit_is_named_and_the_status_kept(tmp_path):
    done = _run(tmp_path, "import user_exits\nuser_exits.reward()\nprint('not reached')")
    assert done.returncode == 3 and done.stdout == ""
    assert done.stderr.startswith(f"relax: user code called os._exit(3) at {tmp_path / 'user_exits.py'}:4 in reward: "
                                  "it ends the rollout worker's process at once"), done.stderr


def test_a_library_call_passes_silently(tmp_path):
    done = _run(tmp_path, "import subprocess, os\nos.register_at_fork  # stdlib imported\n"
                          "exec(compile('import os; os._exit(0)', subprocess.__file__, 'exec'))")
    assert done.returncode == 0 and done.stderr == ""


def test_the_rollout_installs_it():
    import os

    from relax.config.run import RunConfig
    from relax.runtime.step.rollout_worker import RolloutCore

    RolloutCore(RunConfig(), "grpo")
    assert getattr(os._exit, "relax_guard", False)
