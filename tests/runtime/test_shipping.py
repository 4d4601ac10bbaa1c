"""What a run that joins a cluster ships to its workers (issue 25, items 8 and 13): the user's own
modules only, never the working directory, relax or an installed package; ``--ray-working-dir``
within a size limit, without the output directory or Ray's temp dir. No Ray here: the runtime_env
is checked as built (the two-node test runs it for real)."""

from __future__ import annotations

import os
import sys

import attrs
import pytest

from relax.config.run import RunConfig
from relax.runtime.session import ray_session, shipping


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    """A directory the user runs from: a one-file judge, a package with an algorithm, a big data file."""
    (tmp_path / "my_judge.py").write_text("def judge(prompt, completion, label, metadata):\n    return 1.0\n")
    (tmp_path / "my_pkg").mkdir()
    (tmp_path / "my_pkg" / "__init__.py").write_text("")
    (tmp_path / "my_pkg" / "algo.py").write_text("X = 1\n")
    with open(tmp_path / "data.bin", "wb") as f:
        f.truncate(300 * 2**20)  # sparse: 300 MiB to a directory walk, no disk here
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("my_judge", "my_pkg"):
        sys.modules.pop(name, None)
    return tmp_path


def test_only_the_users_modules_are_shipped(user_dir):
    config = RunConfig(ray_address="127.0.0.1:6379", advantage_estimator="my_pkg.algo:MyAlgo",
                       custom_rm_path="my_judge:judge", dynamic_sampling_filter_path="yaml:safe_load")
    assert shipping.user_modules(config) == {"my_pkg": user_dir / "my_pkg", "my_judge": user_dir / "my_judge.py"}
    env = ray_session._runtime_env(config)
    assert sorted(env["py_modules"]) == sorted([str(user_dir / "my_pkg"), str(user_dir / "my_judge.py")])
    assert "working_dir" not in env  # neither data.bin nor anything else of the directory
    assert "PYTHONPATH" not in env["env_vars"]  # the driver's paths mean nothing on another node


def test_relax_and_installed_packages_are_never_shipped(user_dir):
    builtin = RunConfig(ray_address="auto", custom_rm_path="relax.rollout.rewards:call_reward_function",
                        custom_reward_post_process_path="yaml:safe_load")
    assert shipping.user_modules(builtin) == {}
    # nothing shipped at all: the environment and relax's import hook (relax.runtime.data.lazy_dynamo) only
    assert set(ray_session._runtime_env(builtin)) == {"env_vars", "worker_process_setup_hook"}


def test_a_module_that_cannot_be_found_is_named(user_dir):
    config = RunConfig(ray_address="auto", custom_rm_path="no_such_module_here:judge")
    with pytest.raises(shipping.ShippingError, match=r"^--custom-rm-path no_such_module_here:judge: module "
                                                     r"'no_such_module_here' not found from "):
        shipping.user_modules(config)


def test_a_working_dir_over_the_limit_is_refused_with_the_fix(user_dir):
    config = RunConfig(ray_address="auto", ray_working_dir=str(user_dir))
    with pytest.raises(shipping.ShippingError, match=r"holds more than 100 MiB .* relax ships the modules named by "
                                                     r"--advantage-estimator, --custom-rm-path"):
        ray_session._runtime_env(config)


def test_a_working_dir_excludes_the_output_dir_and_rays_temp_dir(user_dir, monkeypatch):
    (user_dir / "data.bin").unlink()
    (user_dir / "outputs" / "run").mkdir(parents=True)
    monkeypatch.setenv("RAY_TMPDIR", str(user_dir / "raytmp"))
    (user_dir / "raytmp").mkdir()
    with open(user_dir / "raytmp" / "spill.bin", "wb") as f:
        f.truncate(300 * 2**20)  # would be over the limit, were it counted
    config = RunConfig(ray_address="auto", ray_working_dir=str(user_dir), output_dir=str(user_dir / "outputs" / "run"))
    env = ray_session._runtime_env(config)
    assert env["working_dir"] == str(user_dir)
    assert {"outputs/run/", "raytmp/", ".git/", "__pycache__/"} <= set(env["excludes"])


def test_a_local_cluster_gets_the_directory_on_its_path_and_ships_nothing(user_dir):
    env = ray_session._runtime_env(RunConfig(custom_rm_path="my_judge:judge"))
    assert set(env) == {"env_vars", "worker_process_setup_hook"}
    assert env["worker_process_setup_hook"] == "relax.runtime.data.lazy_dynamo.install"
    assert env["env_vars"]["PYTHONPATH"].split(os.pathsep)[0] == str(user_dir)


def test_worker_read_paths_become_absolute_when_they_exist_here(user_dir):
    (user_dir / "prompts.jsonl").write_text("{}\n")
    config = RunConfig(ray_address="auto", prompt_data="prompts.jsonl", eval_prompt_data="missing.jsonl")
    fixed = shipping.with_absolute_paths(config)
    assert fixed.prompt_data == str(user_dir / "prompts.jsonl")
    assert fixed.eval_prompt_data == "missing.jsonl"  # not here: left for the workers' own check
    assert attrs.evolve(fixed, prompt_data="prompts.jsonl") == config
