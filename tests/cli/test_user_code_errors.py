"""A reward function that fails in the middle of a run (after pre-flight) ends it with exit 1 and the
user's own code on the console: the exception, the file and line, the step and the worker; the full
traceback is in ``<output_dir>/error.log`` (unit tests of the parts: tests/runtime/test_user_errors.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

# Pre-flight calls the function in the driver; the rollout worker, a process of its own, then calls it
# 16 times per step (4 prompts x 4 samples): its 17th call is the first sample of step 2.
BUGGY = textwrap.dedent(
    """
    CALLS = []


    def reward(prompt, completion, label, metadata):
        CALLS.append(1)
        return ratio(len(CALLS))


    def ratio(calls):
        return 1.0 if calls <= 16 else 1 / (calls - calls)
    """
)

RUN_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled",
           "TQ_NUM_THREADS": "2", "HF_HUB_OFFLINE": "1"}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_reward_function_raising_at_step_2_shows_the_users_file_line_and_step(tmp_path):
    (tmp_path / "relax_step2_reward.py").write_text(BUGGY)
    argv = ["train", "--num-rollout", "4", "--rollout-batch-size", "4", "--n-samples-per-prompt", "4",
            "--custom-rm-path", "relax_step2_reward:reward", "--no-eval", "--no-progress", "--output-dir", "run"]
    script = "import sys; from relax.cli.main import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run([sys.executable, "-c", script, *argv], cwd=tmp_path, env=RUN_ENV, capture_output=True,
                          text=True, timeout=500)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    user_file = tmp_path / "relax_step2_reward.py"
    assert lines[-1].startswith("relax train: error: the rollout worker failed: RewardError: sample "), done.stderr
    assert "raised ZeroDivisionError: division by zero" in lines[-1]
    first = next(i for i, line in enumerate(lines) if "raised in your code:" in line)
    assert lines[first].startswith("relax: ZeroDivisionError: division by zero, at step 2 in RolloutWorker."), lines[first]
    assert lines[first + 1:first + 5] == [
        f'  File "{user_file}", line 7, in reward', "    return ratio(len(CALLS))",
        f'  File "{user_file}", line 11, in ratio', "    return 1.0 if calls <= 16 else 1 / (calls - calls)",
    ]
    assert lines[first + 5] == f"relax: full traceback (every process): run{os.sep}error.log"
    assert "Traceback" not in done.stderr  # a few lines, not Ray's chain
    log = (tmp_path / "run" / "error.log").read_text()
    assert log.startswith("relax run failed at step 2") and "ray::RolloutWorker" in log
