"""What a run asks of its Ray cluster, and whether it can ever fit.

Every role and service of a run requests logical CPUs (and GPUs) from Ray: each worker
``WORKER_CPUS``, the advantages replica ``ADVANTAGES_CPUS`` (unless ``--advantages-on-actor``),
TransferQueue's controller and storage unit one CPU each (a cluster the run joined already has them),
and each reward-service replica ``--reward-model-cpus`` / ``--judge-cpus`` and, when given,
``--reward-model-gpus`` / ``--judge-gpus``. A request that does not fit is not an error in Ray: the
replica waits to be scheduled, and the run waited 300 s before saying it did not start.

- A run that starts its own Ray gives it at least as many logical CPUs as the requests add up to
  (``own_ray_cpus``): CPUs are scheduling tokens, not cores, so a small machine still runs every role.
- Explicit GPU requests are checked before Ray starts against the GPUs torch sees (``gpu_problem``).
- Once Ray is up (a cluster the run joined above all), the services' requests are checked against
  the cluster's totals less what the run's workers take, before they are deployed (``cluster_problem``).

Each refusal names the flags and the free resources.
"""

from __future__ import annotations

import math

WORKER_CPUS = 0.25  # logical: Ray's CPUs are scheduling tokens, not cores (every worker's request)
ADVANTAGES_CPUS = 0.25  # relax.runtime.session.deployments.DEPLOYMENT_OPTIONS
TRANSFERQUEUE_CPUS = 2.0  # controller + storage unit, one CPU each


def service_requests(config) -> list[tuple[str, float, float | None]]:
    """``(flags, CPUs, GPUs or None)`` of each reward service the run deploys, all replicas together."""
    c, found = config, []
    if c.reward_model_path:
        gpus = None if c.reward_model_gpus is None else c.reward_model_replicas * c.reward_model_gpus
        found.append((f"--reward-model-replicas {c.reward_model_replicas} x --reward-model-cpus {c.reward_model_cpus:g}"
                      + ("" if gpus is None else f" / --reward-model-gpus {c.reward_model_gpus:g}"),
                      c.reward_model_replicas * c.reward_model_cpus, gpus))
    if c.judge_model_path:
        gpus = None if c.judge_gpus is None else c.judge_replicas * c.judge_gpus
        found.append((f"--judge-replicas {c.judge_replicas} x --judge-cpus {c.judge_cpus:g}"
                      + ("" if gpus is None else f" / --judge-gpus {c.judge_gpus:g}"),
                      c.judge_replicas * c.judge_cpus, gpus))
    return found


def worker_cpus(config) -> float:
    """The run's workers (rollout, actor, a critic counted when the method may have one) and the
    advantages replica."""
    workers = config.rollout_num_workers + config.actor_num_workers + 1  # + a possible critic
    return WORKER_CPUS * workers + (0.0 if config.advantages_on_actor else ADVANTAGES_CPUS)


def own_ray_cpus(config) -> int:
    """Logical CPUs a run's own Ray needs so that every request is scheduled at once."""
    total = worker_cpus(config) + TRANSFERQUEUE_CPUS + sum(cpus for _, cpus, _ in service_requests(config))
    return math.ceil(total - 1e-9)


def gpu_problem(config, machine_gpus: int) -> str | None:
    """Explicit service GPU requests a run's own Ray on this machine (``machine_gpus``) cannot meet."""
    wanted = [(flags, gpus) for flags, _, gpus in service_requests(config) if gpus]
    total = sum(g for _, g in wanted)
    if total <= machine_gpus + 1e-9:
        return None
    return (f"the reward services ask for {total:g} GPU(s) ({'; '.join(f for f, _ in wanted)}) but this machine "
            f"has {machine_gpus} GPU(s) free to Ray; lower those flags, or leave them out (default: a share of "
            "the GPUs the workers leave free, 0 without GPUs)")


def cluster_problem(config, total_cpus: float, total_gpus: float, worker_gpus: float) -> str | None:
    """The services' requests against the cluster's totals less the run's workers' share (a run's own
    Ray is sized to fit its CPUs by ``own_ray_cpus``; a joined cluster is what it is)."""
    requests = service_requests(config)
    cpus = sum(c for _, c, _ in requests)
    gpus = sum(g for _, _, g in requests if g)
    free_cpus = total_cpus - worker_cpus(config)
    free_gpus = total_gpus - worker_gpus
    if cpus <= free_cpus + 1e-9 and gpus <= free_gpus + 1e-9:
        return None
    where = f"the cluster at --ray-address {config.ray_address}" if config.ray_address else "this run's own Ray"
    return (f"the reward services ask for {cpus:g} CPU(s) and {gpus:g} GPU(s) ({'; '.join(f for f, _, _ in requests)}), "
            f"but {where} has {total_cpus:g} CPU(s) and {total_gpus:g} GPU(s) "
            f"in all, of which the run's workers take {worker_cpus(config):g} CPU(s) and {worker_gpus:g} GPU(s): "
            f"{max(0.0, free_cpus):g} CPU(s) and {max(0.0, free_gpus):g} GPU(s) are left; lower --reward-model-cpus / "
            "--judge-cpus (fractions such as 0.25 are fine) or the replicas, or give the cluster more (relax cluster "
            "up --num-cpus N)")
