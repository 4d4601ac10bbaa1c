"""A failure in the user's code is shown with the user's frames: the exception, file:line and source
line, the step and the worker; the full traceback goes to ``<output_dir>/error.log``."""

from __future__ import annotations

import importlib
import sys
import textwrap

import pytest

from relax.rollout.rewards import RewardError, call_reward_function, load_reward_function
from relax.runtime.files.user_errors import (
    TRACEBACK_NAME,
    describe,
    find_user_failure,
    full_traceback,
    is_user_file,
    report,
)
from relax.runtime.session.waits import WorkerDied

BUGGY = textwrap.dedent(
    """
    def reward(prompt, completion, label, metadata):
        return scale(len(completion))


    def scale(n):
        return 1 / (n - n)
    """
)


@pytest.fixture
def buggy(tmp_path, monkeypatch):
    (tmp_path / "relax_buggy_reward.py").write_text(BUGGY)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path / "relax_buggy_reward.py"
    sys.modules.pop("relax_buggy_reward", None)
    importlib.invalidate_caches()


def _failure_through_relax(buggy_path):
    """The chain a run sees: the user's ZeroDivisionError inside relax's RewardError inside WorkerDied."""
    fn = load_reward_function("relax_buggy_reward:reward")
    try:
        try:
            call_reward_function(fn, ["1+1="], ["2"], ["2"], [{}])
        except RewardError as exc:
            raise WorkerDied(f"the rollout worker failed: RewardError: {exc}") from exc
    except WorkerDied as exc:
        return exc
    raise AssertionError("the reward function did not raise")


def test_only_files_outside_relax_and_the_installed_packages_are_the_users(buggy):
    import torch

    import relax.runtime.driver.train as train_module

    assert is_user_file(str(buggy))
    assert not is_user_file(train_module.__file__) and not is_user_file(torch.__file__)
    assert not is_user_file(importlib.__file__)  # the standard library
    assert not is_user_file("<frozen importlib._bootstrap>")


def test_the_users_frames_the_exception_and_its_source_lines(buggy):
    exc = _failure_through_relax(buggy)
    failure = find_user_failure(full_traceback(exc))
    assert failure.exception == "ZeroDivisionError: division by zero"
    assert [(f.file, f.line, f.function) for f in failure.frames] == [
        (str(buggy), 3, "reward"),
        (str(buggy), 7, "scale"),
    ]
    assert failure.frames[-1].source == "return 1 / (n - n)"
    assert failure.worker is None  # raised in this process


def test_report_writes_the_full_traceback_and_a_few_lines_naming_step_and_file(buggy, tmp_path):
    exc = _failure_through_relax(buggy)
    report(exc, tmp_path, step=2)
    log = (tmp_path / TRACEBACK_NAME).read_text()
    assert log.startswith("relax run failed at step 2")
    assert "Traceback (most recent call last)" in log and "call_reward_function" in log
    lines = exc.relax_details
    assert lines[0] == "relax: ZeroDivisionError: division by zero, at step 2, raised in your code:"
    assert f'  File "{buggy}", line 7, in scale' in lines and "    return 1 / (n - n)" in lines
    assert lines[-1] == f"relax: full traceback (every process): {tmp_path / TRACEBACK_NAME}"
    assert len(lines) <= 8  # a few lines, not the chain


# A traceback as Ray hands it to the driver (RayTaskError's text; the colour codes are Ray's).
RAY_TEXT = """\
Traceback (most recent call last):
  File "{relax}/runtime/session/waits.py", line 150, in get
    return ray.get(refs, timeout=timeout)
ray.exceptions.RayTaskError(RewardError): \x1b[36mray::RolloutWorker.step()\x1b[39m (pid=4335, ip=10.0.0.1, actor_id=2010)
  File "{relax}/rollout/rewards.py", line 224, in call
    return fn(prompts[i], completions[i], labels[i], metadata[i])
  File "{user}", line 3, in reward
    return scale(len(completion))
           ^^^^^^^^^^^^^^^^^^^^^^
  File "{user}", line 7, in scale
    return 1 / (n - n)
           ~~^~~~~~~~~
ZeroDivisionError: division by zero

The above exception was the direct cause of the following exception:

\x1b[36mray::RolloutWorker.step()\x1b[39m (pid=4335, ip=10.0.0.1, actor_id=2010)
  File "{relax}/rollout/rewards.py", line 234, in call_reward_function
    raise failed(i, exc) from exc
relax.rollout.rewards.RewardError: sample 3: reward function relax_buggy_reward.reward raised ZeroDivisionError
"""


def test_a_workers_traceback_names_the_worker(buggy):
    import relax

    text = RAY_TEXT.format(relax=relax.__path__[0], user=buggy)
    lines = describe(text, 2, None)
    assert lines[0] == (
        "relax: ZeroDivisionError: division by zero, at step 2 in RolloutWorker.step (pid 4335), raised in your code:"
    )
    assert lines[1:] == [f'  File "{buggy}", line 3, in reward', "    return scale(len(completion))",
                         f'  File "{buggy}", line 7, in scale', "    return 1 / (n - n)"]


def test_a_failure_inside_relax_names_relaxs_frames_not_your_code():
    import relax

    inner = f"{relax.__path__[0]}/rollout/tasks/addition.py"
    text = RAY_TEXT.format(relax=relax.__path__[0], user=inner)
    assert find_user_failure(text) is None
    lines = describe(text, 2, None)
    assert lines[0] == ("relax: ZeroDivisionError: division by zero, at step 2 in RolloutWorker.step (pid 4335), "
                        "raised in relax:")
    # the worker's frames, innermost last (never the driver's wait in waits.py)
    assert lines[-2:] == [f'  File "{inner}", line 7, in scale', "    return 1 / (n - n)"]
    assert not any("waits.py" in line for line in lines)


# As the H200 run printed it: Ray installed with pip --target into a directory on PYTHONPATH (no
# "site-packages" in its path), the device error raised in relax's numerics inside the actor.
GPU_TEXT = """Traceback (most recent call last):
  File "{relax}/runtime/session/waits.py", line 150, in get
    return ray.get(refs, timeout=timeout)
  File "{site}/ray/_private/worker.py", line 2961, in get
    raise value.as_instanceof_cause()
ray.exceptions.RayTaskError(RuntimeError): ray::ActorWorker.train_step() (pid=911, ip=10.0.0.2, actor_id=77)
  File "{relax}/backends/torch_backend.py", line 272, in train_step
    out = loss_fn(tlp, micro)
  File "{relax}/algorithms/numerics/losses.py", line 60, in masked_inputs
    return x * mask
RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!
"""


def test_packages_installed_into_a_pythonpath_directory_are_not_the_users(tmp_path, monkeypatch):
    import relax
    from relax.runtime.files import user_errors

    site = tmp_path / "site"
    (site / "ray" / "_private").mkdir(parents=True)
    (site / "ray" / "_private" / "worker.py").write_text("")
    (site / "ray-2.60.0.dist-info").mkdir()
    (site / "ray-2.60.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: ray\nVersion: 2.60.0\n")
    (site / "ray-2.60.0.dist-info" / "RECORD").write_text("ray/_private/worker.py,,\n")
    monkeypatch.syspath_prepend(str(site))
    user_errors._library_dirs.cache_clear()
    try:
        assert not is_user_file(str(site / "ray" / "_private" / "worker.py"))
        lines = describe(GPU_TEXT.format(relax=relax.__path__[0], site=site), 1, None)
    finally:
        user_errors._library_dirs.cache_clear()
    assert lines[0].startswith("relax: RuntimeError: Expected all tensors to be on the same device")
    assert lines[0].endswith("at step 1 in ActorWorker.train_step (pid 911), raised in relax:")
    assert f'  File "{relax.__path__[0]}/algorithms/numerics/losses.py", line 60, in masked_inputs' in lines


def test_relaxs_own_error_in_the_driver_gets_no_details():
    import relax

    text = (f'Traceback (most recent call last):\n  File "{relax.__path__[0]}/runtime/session/waits.py", line 150, in get\n'
            f'    raise WorkerDied("the rollout worker died")\nrelax.runtime.session.waits.WorkerDied: the rollout worker died\n')
    assert describe(text, 2, None) is None  # its message already says what happened


def test_report_keeps_the_traceback_of_any_failure(tmp_path):
    exc = WorkerDied("the actor/critic worker died")
    report(exc, tmp_path, step=None)
    assert (tmp_path / TRACEBACK_NAME).read_text().startswith("relax run failed before the first step")
