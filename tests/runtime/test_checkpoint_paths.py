"""The one set of path rules for a relax checkpoint (``--load``, ``--teacher-checkpoint``, a ``relax sft``
checkpoint): a checkpoint file, a ``step_*`` directory, or a run directory's newest step."""

from __future__ import annotations

import pytest

from relax.models.checkpoint_paths import checkpoint_state, policy_weights
from relax.models.initial_weights import checkpoint_dir
from relax.runtime.files.checkpoint_files import checkpoint_path, resolve_checkpoint


def test_a_file_a_step_directory_and_a_run_directory_name_the_same_rules(tmp_path):
    run = tmp_path / "run"
    for step in (2, 10, 9):  # 10 is the newest: zero-padded names sort by step
        checkpoint_path(run, step).parent.mkdir(parents=True)
        checkpoint_path(run, step).write_bytes(b"x")
    newest = checkpoint_path(run, 10)
    assert checkpoint_state(run) == newest and resolve_checkpoint(str(run)) == newest
    assert checkpoint_state(checkpoint_path(run, 2).parent) == checkpoint_path(run, 2)
    assert checkpoint_state(checkpoint_path(run, 9)) == checkpoint_path(run, 9)
    assert checkpoint_dir(run) == newest.parent
    assert checkpoint_state(tmp_path) is None and checkpoint_dir(tmp_path) is None
    with pytest.raises(FileNotFoundError, match="--load .*no checkpoint found"):
        resolve_checkpoint(str(tmp_path))


def test_the_policy_weights_of_a_state_and_a_state_without_them():
    weights = {"w": 1}
    assert policy_weights({"actor": {"backend": {"model": weights}}}) is weights
    with pytest.raises(KeyError):
        policy_weights({"actor": {}})
