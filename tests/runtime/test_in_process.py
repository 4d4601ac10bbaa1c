"""``relax train --in-process`` (relax.runtime.cluster.local_runtime): the driver's own loop with the roles in
its process gives exactly the Ray path's numbers — every metric of every step, the held-out
evaluations and the final weights — resumes from its checkpoints as the Ray path does, and refuses,
naming the flag, what only Ray runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
import torch

from relax.algorithms import load_algorithm
from relax.config.algorithm import AlgorithmConfig
from relax.config.run import RunConfig
from relax.rollout.tasks import get_task
from relax.runtime.checks.validation import validate
from relax.runtime.driver.train import run
from relax.runtime.files.checkpoint_files import checkpoint_path
from tests.runtime.run_results import assert_same_weights, checkpoint_weights, metrics_rows

TIMED_PREFIXES = ("time/", "perf/")  # wall-time measurements
BIN = Path(sys.executable).parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}


def _config(out, **kw) -> RunConfig:
    settings = {"advantage_estimator": "grpo", "rollout_batch_size": 6, "num_steps_per_rollout": 2,
                "num_rollout": 3, "seed": 5, "eval_interval": 2, "progress": False, "output_dir": str(out), **kw}
    algorithm = AlgorithmConfig(reward_keys=get_task("addition").reward_keys, n_samples_per_prompt=4)
    return RunConfig(algorithm=algorithm, **settings)


def _untimed(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith(TIMED_PREFIXES) and not k.endswith("tokens_per_s")}


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_in_process_gives_the_ray_paths_numbers(ray_cluster, tmp_path):
    config = _config(tmp_path / "ray")
    run(config)
    local = run(attrs.evolve(config, in_process=True, output_dir=str(tmp_path / "local")))

    ray_rows, local_rows = metrics_rows(tmp_path / "ray"), metrics_rows(tmp_path / "local")
    assert [r["step"] for r in local_rows] == [0, 1, 2, 3]  # the evaluation before training, then 3 steps
    assert "eval/pass@1" in local_rows[0] and "eval/pass@1" in local_rows[2]  # --eval-interval 2 ran
    assert [_untimed(r) for r in local_rows] == [_untimed(r) for r in ray_rows]  # every metric, exactly
    assert any(r.get("actor/grad_norm", 0.0) > 0 for r in local_rows)  # the steps really trained
    assert local.checkpoint == str(checkpoint_path(tmp_path / "local", 3))
    assert_same_weights(checkpoint_weights(tmp_path / "local", 3), checkpoint_weights(tmp_path / "ray", 3))


def test_in_process_resume_continues_the_run_exactly(tmp_path):
    # gdpo with its advantages on the in-process deployment body; a checkpoint at step 2 of 4
    whole = _config(tmp_path / "whole", advantage_estimator="gdpo", num_rollout=4, save_interval=2, in_process=True)
    run(whole)
    resumed = attrs.evolve(whole, output_dir=str(tmp_path / "resumed"), load=str(checkpoint_path(tmp_path / "whole", 2).parent))
    summary = run(resumed)
    assert summary.steps_run == 2 and summary.last_step == 4
    rows = {r["step"]: _untimed(r) for r in metrics_rows(tmp_path / "whole")}
    again = {r["step"]: _untimed(r) for r in metrics_rows(tmp_path / "resumed")}
    assert again == rows  # steps 3 and 4 as the uninterrupted run's (and the copied rows before them)
    assert summary.eval_before == {k: v for k, v in rows[0].items() if k.startswith("eval/")}
    assert_same_weights(checkpoint_weights(tmp_path / "resumed", 4), checkpoint_weights(tmp_path / "whole", 4))


def _relax(*args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "relax"), "train", *args], cwd=cwd, env=ENV, capture_output=True, text=True,
                          timeout=300, check=False)


def test_relax_train_in_process_starts_no_ray(tmp_path):
    done = _relax("--num-rollout", "2", "--in-process", "--no-progress", "--output-dir", "out", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "relax: in-process: 1 rollout worker and 1 actor rank" in done.stderr
    assert "roles: rollout, advantages, actor (in this process)" in done.stderr  # not "(ray_actor)", "(serve)"
    assert "ray_actor" not in done.stderr and "(serve)" not in done.stderr
    assert "relax: start-up " in done.stderr and "workers_ready_s" in done.stderr
    assert "ray_s" not in done.stderr and "transferqueue_s" not in done.stderr  # no Ray, no TransferQueue
    assert [r["step"] for r in metrics_rows(tmp_path / "out") if r["step"] > 0] == [1, 2]
    assert (tmp_path / "out" / "checkpoints").is_dir()


def test_relax_train_in_process_refuses_what_needs_ray_before_it_starts(tmp_path):
    done = _relax("--in-process", "--rollout-num-workers", "2", "--actor-num-workers", "2", "--fully-async",
                  "--ray-address", "auto", "--output-dir", "out", cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-3000:]
    for reason in ("--rollout-num-workers 2", "--actor-num-workers 2", "--fully-async", "--ray-address auto"):
        assert f"--in-process cannot run {reason}" in done.stderr
    assert "drop --in-process to run it on Ray" in done.stderr
    assert not (tmp_path / "out" / "metrics.jsonl").exists()


@pytest.mark.parametrize(("changes", "named"), [
    ({"advantage_estimator": "ppo"}, "--advantage-estimator ppo (it needs a critic worker)"),
    ({"reward_model_path": "rm"}, "--reward-model-path rm (the reward services run on Ray Serve)"),
    ({"judge_model_path": "judge"}, "--judge-model-path judge"),
    ({"backend": "megatron"}, "--backend megatron"),
    ({"rollout_engine": "vllm"}, "--rollout-engine vllm"),
])
def test_in_process_refusals_name_the_flag(tmp_path, changes, named):
    from relax.runtime.checks.in_process_rules import check_in_process

    config = attrs.evolve(_config(tmp_path), in_process=True, **changes)
    errors: list[str] = []
    check_in_process(config, load_algorithm(config.advantage_estimator), "", errors, [])
    assert any(named in e and e.startswith("--in-process cannot run") for e in errors), errors
    errors = []
    check_in_process(attrs.evolve(config, in_process=False), load_algorithm(config.advantage_estimator), "",
                     errors, [])
    assert errors == []  # the Ray path is not touched by the rule


def test_in_process_accepts_a_machine_with_cuda(tmp_path, monkeypatch):
    """A researcher with one GPU gets the fast start too: the rule no longer refuses CUDA (the
    in-process run on a real GPU is benchmarks/gpu.py's)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    validate(_config(tmp_path, in_process=True), load_algorithm("grpo"))


@pytest.mark.parametrize("where", ["after_the_results", "before_the_row_is_logged"])
def test_an_interrupt_between_a_steps_results_and_its_row_still_logs_the_step_the_model_saves(
        tmp_path, monkeypatch, where):
    # Ctrl-C lands after step 2's results are in: while the pipeline waits for step 1's data-plane clear
    # (a CI run once lost step 2's row there and saved step 2 beside a log that ended at step 1), or
    # while the driver evaluates the step before writing its row. The saved step and the log agree.
    from relax.runtime.driver.pipeline import Pipeline
    from relax.runtime.driver.train import Run

    if where == "after_the_results":
        clear_later = Pipeline._clear_later

        def interrupted_clear(self, step):
            if step == 2:
                raise KeyboardInterrupt
            clear_later(self, step)

        monkeypatch.setattr(Pipeline, "_clear_later", interrupted_clear)
    else:
        record_step = Run._record_step

        def interrupted_record(self, row):
            if row["step"] == 2 and not getattr(self, "_interrupted_once", False):
                self._interrupted_once = True
                raise KeyboardInterrupt
            record_step(self, row)

        monkeypatch.setattr(Run, "_record_step", interrupted_record)
    config = _config(tmp_path, num_rollout=5, eval_interval=None, in_process=True)
    with pytest.raises(KeyboardInterrupt):
        run(config)
    # step 3 was submitted with step 2 (the synchronous schedule runs one rollout ahead): the
    # interrupt finishes it, logs it and saves it; step 2 is logged once
    assert [r["step"] for r in metrics_rows(tmp_path)] == [0, 1, 2, 3]
    assert torch.load(checkpoint_path(tmp_path, 3), weights_only=False)["step"] == 3
    assert not checkpoint_path(tmp_path, 4).parent.exists()


def test_resuming_in_place_from_an_earlier_step_sets_the_later_checkpoints_aside(tmp_path, capsys):
    # A run saved steps 1..4; it is resumed in its own directory from step 2 and stops after step 3. Its
    # step 4 belongs to the continuation the resumed run replaces: moved aside, so that `--load DIR`
    # takes the resumed run's step 3 and --keep-checkpoints 2 keeps steps 2 and 3.
    whole = _config(tmp_path, num_rollout=4, save_interval=1, eval_interval=None, in_process=True)
    run(whole)
    first_4 = checkpoint_weights(tmp_path, 4)
    resumed = attrs.evolve(whole, num_rollout=3, keep_checkpoints=2, load=str(checkpoint_path(tmp_path, 2).parent))
    run(resumed)
    aside = tmp_path / "checkpoints" / "superseded_after_step_000002"
    err = capsys.readouterr().err
    assert (f"relax: warning: --load {resumed.load} resumes from step 2; the checkpoints of steps 3, 4 in "
            f"{tmp_path} came after it and are trained again, so they were moved to {aside}") in err
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "step_000002", "step_000003", "superseded_after_step_000002"]
    assert_same_weights(torch.load(aside / "step_000004" / "state.pt", weights_only=False)["actor"]["backend"]["model"],
                        first_4)
    assert [r["step"] for r in metrics_rows(tmp_path)] == [0, 1, 2, 3]
    from relax.models.checkpoint_paths import checkpoint_state

    assert checkpoint_state(tmp_path) == checkpoint_path(tmp_path, 3)
