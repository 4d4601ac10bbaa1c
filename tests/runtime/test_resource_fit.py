"""Every role and reward service fits the cluster, or the run is refused naming the flags and what is
free: a run's own Ray is sized to the requests; a joined cluster's totals are checked before the
services are deployed; explicit service GPUs beyond the machine's are refused before Ray. Ray itself is
not started here (``ray.init`` / ``ray.cluster_resources`` are replaced)."""

from __future__ import annotations

import pytest

from relax.config.run import RunConfig
from relax.runtime.checks import resource_fit

SERVICES = {"reward_model_path": "rm", "judge_model_path": "judge", "judge_template": "t.txt"}


def test_the_counted_requests_are_the_ones_the_roles_make():
    from relax.runtime.session.deployments import DEPLOYMENT_OPTIONS
    from relax.runtime.session.ray_session import WORKER_CPUS

    assert DEPLOYMENT_OPTIONS["ray_actor_options"]["num_cpus"] == resource_fit.ADVANTAGES_CPUS
    assert WORKER_CPUS == resource_fit.WORKER_CPUS


def test_the_requests_add_up_by_hand():
    config = RunConfig(**SERVICES)  # defaults: 1 rollout worker, 1 actor rank, 1 CPU per replica
    # workers (1 + 1 + a possible critic) x 0.25 + advantages 0.25 + TransferQueue 2 + RM 1 + judge 1 = 5
    assert resource_fit.own_ray_cpus(config) == 5
    more = RunConfig(**SERVICES, reward_model_replicas=3, reward_model_cpus=0.5, rollout_num_workers=2,
                     advantages_on_actor=True)
    # 4 x 0.25 + 0 + 2 + 3 x 0.5 + 1 = 5.5 -> 6
    assert resource_fit.own_ray_cpus(more) == 6
    assert resource_fit.own_ray_cpus(RunConfig()) == 3  # 0.75 + 0.25 + 2


def test_a_runs_own_ray_gets_the_cpus_its_requests_add_up_to(monkeypatch):
    import ray

    from relax.runtime.session import ray_session

    seen = {}

    class Stop(Exception):
        pass

    def fake_init(**kwargs):
        seen.update(kwargs)
        raise Stop

    # start_ray sets this process's environment for the Ray it would start (a new run prefix among it):
    # a copy keeps the shared test cluster's runs on the prefix their workers were started with
    monkeypatch.setattr(ray_session.os, "environ", dict(ray_session.os.environ))
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", fake_init)
    monkeypatch.setattr(ray_session, "Watchdog", lambda: None)
    monkeypatch.setattr(ray_session.os, "cpu_count", lambda: 2)  # the 2-core machine of the report
    big = RunConfig(**SERVICES, reward_model_replicas=4, judge_replicas=4)  # 0.75 + 0.25 + 2 + 4 + 4 = 11
    with pytest.raises(Stop):
        ray_session.start_ray(big)
    assert seen["num_cpus"] == 11


def test_a_joined_cluster_too_small_for_the_services_is_refused_naming_flags_and_free_resources(monkeypatch):
    import ray

    from relax.runtime.cluster.reward_services import RewardServices
    from relax.runtime.session.waits import WorkerDied

    config = RunConfig(**SERVICES, ray_address="127.0.0.1:6380")
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})
    with pytest.raises(WorkerDied) as caught:
        RewardServices(config, free_gpus=0.0).start()
    message = str(caught.value)
    assert "ask for 2 CPU(s) and 0 GPU(s)" in message
    assert "--reward-model-replicas 1 x --reward-model-cpus 1; --judge-replicas 1 x --judge-cpus 1" in message
    assert "the cluster at --ray-address 127.0.0.1:6380 has 2 CPU(s) and 0 GPU(s)" in message
    assert "take 1 CPU(s)" in message and "1 CPU(s) and 0 GPU(s) are left" in message

    fits = RunConfig(**SERVICES, ray_address="127.0.0.1:6380", reward_model_cpus=0.25, judge_cpus=0.25)
    assert resource_fit.cluster_problem(fits, 2.0, 0.0, 0.0) is None  # 1 + 0.5 <= 2


def test_service_gpus_are_checked_against_free_gpus():
    config = RunConfig(**SERVICES, reward_model_gpus=1.0, judge_gpus=0.5, judge_replicas=2)
    assert resource_fit.cluster_problem(config, 16.0, 2.0, 0.0) is None  # 1 + 2 x 0.5 = 2 GPUs of 2
    problem = resource_fit.cluster_problem(config, 16.0, 2.0, 1.0)  # the workers hold one
    assert "and 2 GPU(s)" in problem and "--reward-model-gpus 1" in problem and "--judge-gpus 0.5" in problem
    assert "1 GPU(s) are left" in problem
    machine = resource_fit.gpu_problem(config, 1)
    assert machine.startswith("the reward services ask for 2 GPU(s)") and "this machine has 1 GPU(s)" in machine
