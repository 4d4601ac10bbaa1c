"""Pre-started workers on a kept cluster: the warm path's last step.

On a kept cluster (``relax cluster up``, then ``relax train --ray-address ...``) Ray, Serve's
controller and TransferQueue stay up between runs, but each run's rollout workers and actor ranks
were new processes that imported torch, TransferQueue and relax and built their model: 4-6 s of a
warm start-up on 2 cores. The pool keeps *spares*: worker processes of the run's own classes
(``PooledRolloutWorker`` is a ``RolloutWorker``) whose ``__init__`` only does those imports. A run
claims spares and calls ``setup(...)``, the real worker's ``__init__``; from then on the spare is
that worker (every method, Ray's ``__ray_call__`` and ``ray.kill`` work on its handle as on a worker
the run created), and it dies with the run. The pool boots replacements when the run ends, so that
their imports do not compete with the run for the CPU.

A spare never serves two runs, so no state (nor a user's module) crosses runs. Spares are used only
when they run the same relax code as the run (``code_fingerprint``), need no GPU, and the driver
runs on the pool's machine (the user's modules are found through the driver's ``sys.path``, which a
spare cannot be given by Ray's runtime environment once it is started); otherwise the run says why
and starts its own workers, as on any cluster.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import threading
import time
import uuid
from pathlib import Path

import relax

POOL_NAME, POOL_NAMESPACE = "relax_worker_pool", "relax"
KINDS = ("rollout", "actor")  # the critic (PPO) is started by the run itself
CHECK_DRIVERS_S = 2.0


def code_fingerprint() -> str:
    """Which relax a process runs: its interpreter and every source file's path, size and mtime."""
    root = Path(relax.__file__).resolve().parent
    digest = hashlib.sha256(sys.executable.encode())
    for path in sorted(root.rglob("*.py")):
        stat = path.stat()
        digest.update(f"{path.relative_to(root)}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


def _warm_imports(kind: str) -> None:
    """What the worker's ``__init__`` would import first (torch alone is ~1.3 s of CPU)."""
    import torch

    import relax.models.tiny
    import relax.runtime.data.data_plane  # noqa: F401  (TransferQueue, without torch._dynamo)

    if kind == "actor":
        # torch.optim's Optimizer.__init__ imports torch._dynamo (1.3-2 s) on the first optimizer
        # built: the actor rank's backend builds one, so its spare pays that here
        torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.0)


def _enter_run(run_env: dict) -> None:
    """Give a spare what Ray's runtime environment gives a worker the run starts: the run's
    environment variables (its data-plane prefix among them) and import path."""
    os.environ.update(run_env.get("env_vars", {}))
    for path in reversed(run_env.get("sys_path", [])):
        if path not in sys.path:
            sys.path.insert(0, path)
    if run_env.get("cwd"):
        with contextlib.suppress(OSError):
            os.chdir(run_env["cwd"])


def _pooled(worker_cls: type, kind: str) -> type:
    """``worker_cls`` whose ``__init__`` only warms up; ``setup`` is the real ``__init__``."""

    def __init__(self):
        _warm_imports(kind)

    def setup(self, run_env: dict, *args, **kwargs) -> bool:
        _enter_run(run_env)
        worker_cls.__init__(self, *args, **kwargs)
        return True

    return type(f"Pooled{worker_cls.__name__}", (worker_cls,), {"__init__": __init__, "setup": setup,
                                                                "__module__": __name__})


def pooled_class(kind: str) -> type:
    if kind == "rollout":
        from relax.runtime.step.rollout_worker import RolloutWorker

        return _pooled(RolloutWorker, kind)
    from relax.runtime.step.actor_worker import ActorWorker

    return _pooled(ActorWorker, kind)


class WorkerPool:
    """A detached Ray actor (``relax cluster up`` starts it): spares per kind, the claims of the
    runs using them, and a thread that releases the claim of a driver that died."""

    def __init__(self, spares: int, worker_cpus: float):
        self.target, self.worker_cpus = spares, worker_cpus
        self.fingerprint = code_fingerprint()
        self.node_ip = _node_ip()
        self.spares: dict[str, list] = {kind: [] for kind in KINDS}
        self.claims: dict[str, tuple[int, list]] = {}  # claim id -> (driver pid, handles)
        self.lock = threading.Lock()
        self.refill()
        threading.Thread(target=self._watch_drivers, name="relax-pool-drivers", daemon=True).start()

    def _spawn(self, kind: str):
        import ray

        return ray.remote(pooled_class(kind)).options(num_cpus=self.worker_cpus, max_restarts=0).remote()

    def refill(self) -> None:
        with self.lock:
            for kind in KINDS:
                while len(self.spares[kind]) < self.target:
                    self.spares[kind].append(self._spawn(kind))

    def wait_ready(self) -> dict:
        """Block until every spare has booted (``relax cluster up`` returns then)."""
        import ray

        with self.lock:
            spares = [h for hs in self.spares.values() for h in hs]
        ray.get([h.__ray_ready__.remote() for h in spares])
        return self.describe()

    def describe(self) -> dict:
        with self.lock:
            return {"fingerprint": self.fingerprint, "node_ip": self.node_ip,
                    "spares": {k: len(v) for k, v in self.spares.items()}, "claims": len(self.claims)}

    def claim(self, wanted: dict[str, int], driver_pid: int) -> tuple[str, dict[str, list]]:
        """Hand ``wanted[kind]`` workers of each kind to the run of ``driver_pid`` (spares first,
        new ones when there are not enough)."""
        claim_id = uuid.uuid4().hex[:12]
        with self.lock:
            given = {}
            for kind, n in wanted.items():
                take, self.spares[kind] = self.spares[kind][:n], self.spares[kind][n:]
                given[kind] = take + [self._spawn(kind) for _ in range(n - len(take))]
            self.claims[claim_id] = (driver_pid, [h for hs in given.values() for h in hs])
        return claim_id, given

    def release(self, claim_id: str) -> None:
        """The run is over: its workers go, replacements boot."""
        import ray

        with self.lock:
            _, handles = self.claims.pop(claim_id, (None, []))
        for handle in handles:
            with contextlib.suppress(Exception):
                ray.kill(handle)
        self.refill()

    def _watch_drivers(self) -> None:
        while True:
            time.sleep(CHECK_DRIVERS_S)
            with self.lock:
                gone = [cid for cid, (pid, _) in self.claims.items() if not _alive(pid)]
            for claim_id in gone:
                self.release(claim_id)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _node_ip() -> str:
    import ray

    return ray.util.get_node_ip_address()


def find_pool():
    """The kept cluster's pool, or None."""
    import ray

    try:
        return ray.get_actor(POOL_NAME, namespace=POOL_NAMESPACE)
    except ValueError:
        return None


def start_pool(spares: int, worker_cpus: float) -> dict:
    """Start the pool (detached; ``relax cluster up``) and wait until its spares have booted."""
    import ray

    pool = ray.remote(WorkerPool).options(
        name=POOL_NAME, namespace=POOL_NAMESPACE, lifetime="detached", get_if_exists=True, num_cpus=0,
        max_concurrency=4,
    ).remote(spares, worker_cpus)
    return ray.get(pool.wait_ready.remote())


class PoolClaim:
    """A run's workers from the pool: ``setup`` turns spares into the run's workers."""

    def __init__(self, pool, claim_id: str, handles: dict[str, list], run_env: dict):
        self.pool, self.claim_id, self.handles, self.run_env = pool, claim_id, handles, run_env
        self.setups: list = []  # the setup calls' references: the run waits for them at start-up

    def setup(self, kind: str, calls: list[tuple[tuple, dict]]) -> list:
        handles = self.handles[kind]
        for handle, (args, kwargs) in zip(handles, calls):
            self.setups.append(handle.setup.remote(self.run_env, *args, **kwargs))
        return handles

    def release(self) -> None:
        with contextlib.suppress(Exception):
            self.pool.release.remote(self.claim_id)


def claim(config, wanted: dict[str, int], env_vars: dict, *, gpus: bool) -> tuple[PoolClaim | None, str | None]:
    """Workers from the kept cluster's pool for this run, or ``(None, why not)``; ``(None, None)``
    when the cluster has no pool (nothing to say: the user did not start one)."""
    import ray

    pool = find_pool() if config.ray_address else None
    if pool is None:
        return None, None
    about = ray.get(pool.describe.remote(), timeout=30)
    if gpus:
        why = "this run asks for GPUs (the pool's workers have none)"
    elif config.ray_working_dir:
        why = "--ray-working-dir ships a directory, which a started worker cannot be given"
    elif about["node_ip"] != _node_ip():
        why = f"the pool runs on {about['node_ip']}, this driver on another machine"
    elif about["fingerprint"] != code_fingerprint():
        why = "its workers were started with other relax code (restart it: relax cluster up)"
    else:
        claim_id, handles = ray.get(pool.claim.remote(wanted, os.getpid()), timeout=60)
        paths = [os.getcwd()] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        run_env = {"env_vars": env_vars, "sys_path": list(dict.fromkeys(paths)), "cwd": os.getcwd()}
        return PoolClaim(pool, claim_id, handles, run_env), None
    return None, why
