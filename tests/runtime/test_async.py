"""Several rollout workers and asynchronous training (``--fully-async --max-staleness K``).

The schedule is checked as a property of the driver's two decisions (which rollouts may be in
flight, which policy version each samples with); the runs check that K = 0 reproduces the
synchronous run bit for bit, that K = 1 samples one version behind (the actor checks every sample's
recorded version against the bound), that N rollout workers are deterministic, and that an
asynchronous run resumed from a checkpoint reaches the uninterrupted run's weights.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from run_results import assert_same_weights as _assert_same_weights
from run_results import checkpoint_weights as _weights
from run_results import training_rows as _rows

from relax.algorithms import AlgorithmConfig
from relax.config.run import RunConfig
from relax.runtime.driver.pipeline import rollout_version
from relax.runtime.driver.train import run, saves_at, submit_limit

KEYS = ("correct", "digits", "format", "length")


@settings(max_examples=200, deadline=None)
@given(
    k=st.integers(0, 4),
    save_interval=st.one_of(st.none(), st.integers(1, 6)),
    num_rollout=st.integers(1, 14),
    start=st.integers(0, 13),
)
def test_no_sample_is_older_than_the_bound_and_no_rollout_runs_past_an_unwritten_checkpoint(
    k, save_interval, num_rollout, start
):
    start = min(start, num_rollout - 1)
    config = RunConfig(num_rollout=num_rollout, save_interval=save_interval, fully_async=True, max_staleness=k)
    floor, last, versions = start, start, {}
    for step in range(start + 1, num_rollout + 1):  # what train.run and Pipeline.step do
        for t in range(last + 1, max(step, submit_limit(config, step)) + 1):
            v = rollout_version(t, k, floor)
            assert floor <= v <= t - 1  # an existing version, never older than the last checkpoint
            assert (t - 1) - v <= k  # the staleness bound
            assert not any(saves_at(config, u) for u in range(step, t)), "rollout submitted past a checkpoint"
            assert t <= min(step + 1 + k, num_rollout)
            versions[t] = v
        last = max(last, submit_limit(config, step), step)
        if saves_at(config, step):
            floor = step
    assert sorted(versions) == list(range(start + 1, num_rollout + 1))
    if k == 0:
        assert all(v == t - 1 for t, v in versions.items())  # the synchronous schedule


def _config(algo: str, out, **kw) -> RunConfig:
    algorithm = kw.pop("algorithm", {})
    base = {
        "advantage_estimator": algo,
        "algorithm": AlgorithmConfig(reward_keys=KEYS, n_samples_per_prompt=4, **algorithm),
        "rollout_batch_size": 4,
        "num_steps_per_rollout": 2,
        "num_rollout": 3,
        "seed": 5,
        "save_interval": 3,
        "output_dir": str(out),
        "progress": False,
    }
    base.update(kw)
    return RunConfig(**base)


def _numbers(row: dict, evaluation: bool = True) -> dict:
    """A row without what depends on wall time or exists only in asynchronous runs (and, with
    ``evaluation=False``, without the evaluation: a run stopped early evaluates at its own last step)."""
    skip = ("time/", "perf/", "async/") + (() if evaluation else ("eval/",))
    return {k: v for k, v in row.items() if not k.startswith(skip) and not k.endswith("_per_s")}


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("algo", ["grpo", "gdpo"])
def test_max_staleness_0_reproduces_the_synchronous_run(algo, ray_cluster, tmp_path):
    """... also when the asynchronous run's weights travel by broadcast (--weight-transport collective):
    every rollout (rewards, evaluation) and the final weights equal the object store's bit for bit."""
    run(_config(algo, tmp_path / "sync"))
    run(_config(algo, tmp_path / "async", fully_async=True, max_staleness=0, weight_transport="collective"))
    sync, asyn = _rows(tmp_path / "sync"), _rows(tmp_path / "async")
    assert [_numbers(r) for r in asyn] == [_numbers(r) for r in sync]
    assert all(r["async/staleness_max"] == 0 for r in asyn if "async/staleness_max" in r)
    _assert_same_weights(_weights(tmp_path / "async", 3), _weights(tmp_path / "sync", 3))


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_rollout_workers_are_deterministic_and_share_the_step(ray_cluster, tmp_path):
    for name in ("a", "b"):
        run(_config("gdpo", tmp_path / name, rollout_num_workers=2))
    a, b = _rows(tmp_path / "a"), _rows(tmp_path / "b")
    assert [_numbers(r) for r in a] == [_numbers(r) for r in b]
    assert all(r["rollout/groups_kept"] + r["rollout/groups_dropped"] == 4 for r in a)
    _assert_same_weights(_weights(tmp_path / "a", 3), _weights(tmp_path / "b", 3))
    # The step's prompts do not depend on the number of workers, only the samples do.
    one = tmp_path / "one"
    run(_config("gdpo", one, num_rollout=1, save_interval=None))
    assert _rows(one)[0]["rollout/groups_kept"] + _rows(one)[0]["rollout/groups_dropped"] == 4


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_async_k1_with_two_workers_resumes_to_the_uninterrupted_weights(ray_cluster, tmp_path):
    settings_ = {"fully_async": True, "max_staleness": 1, "rollout_num_workers": 2, "num_rollout": 5,
                 "save_interval": 3, "algorithm": {"off_policy_correction": "tis"}}
    full = tmp_path / "full"
    run(_config("gdpo", full, **settings_))
    rows = _rows(full)
    # Step 1 samples with the initial policy; after it each rollout runs one version ahead, except
    # right after the checkpoint of step 3, where the rollout waits for the checkpointed weights.
    assert [r["async/staleness_max"] for r in rows] == [0, 1, 1, 0, 1]
    assert [r["async/policy_version"] for r in rows] == [0, 0, 1, 3, 3]
    assert all(0 <= r["actor/off_policy_weight"] <= 2.0 for r in rows)  # the TIS cap
    # the interrupted run sends its weights by broadcast (--weight-transport collective), the restored
    # ones too: versions published ahead of the rollouts (K = 1), two receivers, the same numbers
    part, collective = tmp_path / "part", {**settings_, "weight_transport": "collective"}
    run(_config("gdpo", part, **{**collective, "num_rollout": 3}))
    run(_config("gdpo", part, **collective, load=str(part)))
    assert [_numbers(r, evaluation=False) for r in _rows(part)] == [_numbers(r, evaluation=False) for r in rows]
    # both evaluated the final policy (version 5) identically: the resumed run restored the same weights
    assert _numbers(_rows(part)[-1]) == _numbers(rows[-1]) and rows[-1]["eval/policy_version"] == 5
    _assert_same_weights(_weights(part, 5), _weights(full, 5))


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_gdpo_fully_async_learns_the_embedded_default(ray_cluster, tmp_path):
    """The embedded default with --fully-async (K = 1): every step after the first trains on samples
    one version old, and the rewards rise (deterministic for the seed: not a flaky threshold)."""
    out = tmp_path / "gdpo-async"
    run(RunConfig(advantage_estimator="gdpo", algorithm=AlgorithmConfig(reward_keys=KEYS), num_steps_per_rollout=2,
                  fully_async=True, num_rollout=60, output_dir=str(out), progress=False))
    rows = _rows(out)
    assert all(r["async/staleness_max"] == 1 for r in rows[1:] if "async/staleness_max" in r)

    def mean(key, part):
        return sum(r[key] for r in part) / len(part)

    for key in ("reward/correct/mean", "reward/format/mean"):
        assert mean(key, rows[-10:]) > mean(key, rows[:10]) + 0.1, key


def test_a_checkpoint_of_another_rollout_worker_count_is_refused():
    from relax.runtime.files.checkpoint_files import CheckpointError, check_checkpoint

    state = {"step": 2, "advantage_estimator": "grpo", "critic": None, "backend": "torch",
             "actor": {"backend": {}}, "rollout": [{"prompts": {}}, {"prompts": {}}]}
    check_checkpoint(RunConfig(num_rollout=4, rollout_num_workers=2), state, "run1", has_critic=False)
    with pytest.raises(CheckpointError, match="written by 2 rollout worker.*resume with --rollout-num-workers 2"):
        check_checkpoint(RunConfig(num_rollout=4), state, "run1", has_critic=False)
