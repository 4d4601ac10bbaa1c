"""A run keeps its model, keeps only --keep-checkpoints of them, never hangs on a reward call or a
dead TransferQueue component, and prints nothing on stdout (issue 13, items 3-5).

Unit tests first; then three short ``relax train`` runs in a subprocess (their own Ray), as a user
would start them: a successful one (stdout empty, no ``(raylet)`` line, the final model saved, only
the newest checkpoints kept), one whose reward function exceeds ``--reward-timeout``, and one whose
TransferQueue controller is killed mid-run. (Ctrl-C / SIGTERM saving the model: the SIGTERM run in
tests/cli/test_bad_inputs.py.)
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from relax.config.run import RunConfig
from relax.rollout.rewards import RewardError, call_reward_function, function_name, with_timeout
from relax.runtime.driver.train import saves_at, submit_limit
from relax.models.checkpoint_paths import checkpoint_state
from relax.runtime.files.checkpoint_files import prune_checkpoints, set_aside_later_checkpoints

# -- which steps are saved ----------------------------------------------------------------------------


def test_the_final_step_is_always_saved():
    plain = RunConfig(num_rollout=5)
    assert [t for t in range(1, 6) if saves_at(plain, t)] == [5]
    every2 = RunConfig(num_rollout=5, save_interval=2)
    assert [t for t in range(1, 6) if saves_at(every2, t)] == [2, 4, 5]
    # the pipeline never submits a rollout past a checkpoint that is not written yet
    async_plain = RunConfig(num_rollout=5, fully_async=True, max_staleness=3)
    assert submit_limit(async_plain, 1) == 5 and submit_limit(async_plain, 4) == 5
    assert submit_limit(RunConfig(num_rollout=5, save_interval=2, fully_async=True, max_staleness=3), 1) == 2


def _fake_checkpoint(out: Path, step: int) -> Path:
    path = out / "checkpoints" / f"step_{step:06d}" / "state.pt"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"x")
    return path.parent


def test_keep_checkpoints_deletes_the_lowest_steps_whatever_their_file_times(tmp_path):
    dirs = {s: _fake_checkpoint(tmp_path, s) for s in (1, 2, 10, 3)}
    os.utime(dirs[10] / "state.pt", ns=(1, 1))  # a copied run's file times say nothing of the order
    (tmp_path / "checkpoints" / "notes").mkdir()  # not a checkpoint: left alone
    (tmp_path / "checkpoints" / "step_000011").mkdir()  # no state.pt: not a checkpoint either
    deleted = prune_checkpoints(tmp_path, 2)
    assert deleted == [dirs[1], dirs[2]]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "notes", "step_000003", "step_000010", "step_000011"]
    assert prune_checkpoints(tmp_path, 2) == []
    assert checkpoint_state(tmp_path) == dirs[10] / "state.pt"  # --load DIR: the highest step


def test_a_resume_from_an_earlier_step_sets_the_later_checkpoints_aside(tmp_path):
    dirs = {s: _fake_checkpoint(tmp_path, s) for s in (2, 4, 6)}
    assert set_aside_later_checkpoints(tmp_path, 6) is None  # nothing after the last step
    where, steps = set_aside_later_checkpoints(tmp_path, 2)
    assert steps == [4, 6] and where == tmp_path / "checkpoints" / "superseded_after_step_000002"
    assert sorted(p.name for p in where.iterdir()) == ["step_000004", "step_000006"]
    assert (where / "step_000004" / "state.pt").read_bytes() == b"x"  # moved whole, nothing deleted
    assert checkpoint_state(tmp_path) == dirs[2] / "state.pt"
    _fake_checkpoint(tmp_path, 4)  # the resumed run went on, then was resumed from step 2 again
    assert set_aside_later_checkpoints(tmp_path, 2) == (where.with_name(where.name + "_2"), [4])


# -- --reward-timeout ---------------------------------------------------------------------------------


def _slow_on(index: int, seconds: float):
    def judge(prompt, completion, label, metadata):
        if metadata["i"] == index:
            time.sleep(seconds)
        return float(metadata["i"])

    return judge


def _call(fn, n: int = 4, concurrency: int = 1):
    return call_reward_function(fn, ["p"] * n, [f"c{i}" for i in range(n)], [None] * n,
                                [{"i": i} for i in range(n)], concurrency)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("concurrency", [1, 3])
def test_a_reward_call_over_the_timeout_names_the_function_and_the_sample(concurrency):
    fn = with_timeout(_slow_on(2, 20.0), 0.3)
    with pytest.raises(RewardError) as info:
        _call(fn, concurrency=concurrency)
    message = str(info.value)
    assert message.startswith("sample 2: reward function ") and "_slow_on.<locals>.judge" in message
    assert "did not return within --reward-timeout 0.3s" in message and "completion 'c2'" in message
    assert "raise --reward-timeout" in message


@pytest.mark.timeout(30)
def test_calls_within_the_timeout_keep_their_order_and_name():
    fn = with_timeout(_slow_on(0, 0.05), 10)
    assert _call(fn, concurrency=2) == [0.0, 1.0, 2.0, 3.0]
    assert function_name(fn).endswith("_slow_on.<locals>.judge")
    assert with_timeout(fn.fn, None) is fn.fn  # no flag: the function itself


@pytest.mark.timeout(30)
def test_an_async_reward_over_the_timeout():
    async def judge(prompt, completion, label, metadata):
        await asyncio.sleep(20 if metadata["i"] == 1 else 0)
        return 1.0

    with pytest.raises(RewardError, match=r"sample 1: reward function .*judge did not return within --reward-timeout 0.2s"):
        _call(with_timeout(judge, 0.2))


# -- a dead TransferQueue component is reported, not waited on ----------------------------------------


@pytest.mark.ray
@pytest.mark.timeout(120)
def test_a_dead_watched_component_fails_the_drivers_wait(ray_cluster):
    import ray

    from relax.runtime.session import waits

    @ray.remote(num_cpus=0)
    class Component:
        def sleep(self, seconds):
            time.sleep(seconds)
            return seconds

    busy, victim = Component.remote(), Component.remote()
    assert waits.get([busy.sleep.remote(0), victim.sleep.remote(0)], "test") == [0, 0]
    waits.watch_components([("test storage unit (actor Victim)", victim)])
    try:
        ray.kill(victim)
        with pytest.raises(waits.WorkerDied, match=r"^the test storage unit \(actor Victim\) died"):
            waits.get(busy.sleep.remote(60), "rollout")
    finally:
        waits.watch_components([])
        ray.kill(busy)


# -- real runs ------------------------------------------------------------------------------------------

RUN_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled",
           "TQ_NUM_THREADS": "2", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline",
           "PATH": os.pathsep.join([str(Path(__file__).resolve().parents[2] / ".venv" / "bin"),
                                    os.environ.get("PATH", "")])}
SHORT = ["--num-rollout", "3", "--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--no-progress"]


def _relax_train(*argv, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    relax = shutil.which("relax", path=RUN_ENV["PATH"])
    assert relax, "the relax console script is not installed"
    return subprocess.run([relax, "train", *argv], check=False, cwd=cwd, env=RUN_ENV, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_run_is_quiet_and_keeps_its_newest_checkpoints(tmp_path):
    done = _relax_train(*SHORT, "--output-dir", "run", "--save-interval", "1", "--keep-checkpoints", "2",
                        "--reward-timeout", "60", cwd=tmp_path, timeout=360)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "", "stdout must carry only what relax prints (nothing for relax train)"
    assert "(raylet)" not in done.stderr and "killed by `ray.kill`" not in done.stderr
    assert "Traceback" not in done.stderr
    checkpoints = tmp_path / "run" / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step_000002", "step_000003"]
    state = torch.load(checkpoints / "step_000003" / "state.pt", weights_only=False)
    assert state["step"] == 3
    assert f"model: run{os.sep}checkpoints{os.sep}step_000003" in done.stderr


SLOW_JUDGE = textwrap.dedent(
    """
    import time

    def judge(prompt, completion, label, metadata):
        if completion not in ("", str(label)):  # pre-flight calls only these two: it passes
            time.sleep(120)
        return float(completion == str(label))
    """
)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_reward_call_over_reward_timeout_stops_the_run(tmp_path):
    (tmp_path / "relax_slow_judge.py").write_text(SLOW_JUDGE)
    done = _relax_train(*SHORT, "--output-dir", "run", "--custom-rm-path", "relax_slow_judge:judge",
                        "--reward-keys", "reward", "--reward-timeout", "2", cwd=tmp_path, timeout=360)
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("relax train: error: the rollout worker failed: RewardError: sample "), done.stderr
    assert "reward function relax_slow_judge.judge did not return within --reward-timeout 2s" in last
    assert done.stdout == "" and "Traceback" not in done.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()  # nothing trained, nothing saved


# The run's own cluster, found by its raylet's temp dir: `ray.init(address="auto")` joins *any* Ray
# on the machine when no `ray start` wrote an address (ray.init's local clusters never do), and once
# killed the test session's shared TransferQueue controller instead of the run's.
KILL_CONTROLLER = textwrap.dedent(
    """
    import os, ray
    tmp = os.path.join(os.environ["RAY_TMPDIR"], "ray")
    address = None
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            args = open(f"/proc/{pid}/cmdline", "rb").read().decode().split(chr(0))
        except OSError:
            continue
        if any(a.endswith("raylet/raylet") for a in args) and f"--temp_dir={tmp}" in args:
            address = next(a.split("=", 1)[1] for a in args if a.startswith("--gcs-address="))
    assert address, f"no raylet with --temp_dir={tmp}"
    ray.init(address=address, logging_level="ERROR")
    ray.kill(ray.get_actor("TransferQueueController", namespace="transfer_queue"))
    """
)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_killed_transferqueue_controller_stops_the_run_with_one_line(tmp_path):
    import tempfile

    # the run's own Ray, in a private directory (short: unix socket paths are limited), so that the
    # killer below joins this run's cluster and nobody else's
    ray_tmp = tempfile.mkdtemp(prefix="rk_", dir="/tmp")
    env = {**RUN_ENV, "RAY_TMPDIR": ray_tmp}
    relax = shutil.which("relax", path=RUN_ENV["PATH"])
    run = subprocess.Popen([relax, "train", *SHORT, "--num-rollout", "5000", "--output-dir", "run"], cwd=tmp_path,
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "run" / "metrics.jsonl"
    try:
        # until a training step is logged (step 0, the evaluation before training, comes first)
        while not (metrics.exists() and any(not line.startswith('{"step": 0,')
                                            for line in metrics.read_text().splitlines())) and run.poll() is None:
            time.sleep(0.5)
        assert run.poll() is None, run.communicate()[1]
        subprocess.run([sys.executable, "-c", KILL_CONTROLLER], env=env, check=True, timeout=120,
                       capture_output=True)
        stdout, stderr = run.communicate(timeout=120)  # reported in seconds, not after minutes of retries
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert run.returncode == 1, stderr
    assert stderr.strip().splitlines()[-1].startswith(
        "relax train: error: the TransferQueue controller (actor TransferQueueController) died"
    ), stderr
    assert stdout == "" and "Traceback" not in stderr
