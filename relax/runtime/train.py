"""``run(config)``: the training driver behind ``relax train``.

It starts (or joins) Ray, builds the roles that ``derive_roles`` asks for, and runs ``num_rollout``
synchronous steps: rollout -> [reference KL / critic values] -> advantages -> actor (+ critic)
training -> new weights to the rollout. The driver only moves small control messages; batches go
through the TransferQueue data plane and the new weights go from actor rank 0 to the rollout as a
Ray object reference (never through the driver).
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
from pathlib import Path

import attrs
import torch

from relax.algorithms import load_algorithm
from relax.runtime import roles as R
from relax.runtime.actor_metrics import STEP_METRICS_KEY, combine_actor_metrics
from relax.runtime.actor_worker import num_minibatches, plan_from_rollout
from relax.runtime.data_plane import partition_name
from relax.runtime.environment import RAY_ENV_DEFAULTS, apply_environment_defaults
from relax.runtime.metrics import MetricsLog, summary_table

WORKER_CPUS = 0.25  # logical: Ray's CPUs are scheduling tokens, not cores
STARTUP_TIMEOUT_S = 300


@attrs.frozen
class RunSummary:
    output_dir: str
    steps_run: int
    last_step: int
    reward_first_last: dict  # component -> (mean over first 10% of steps, mean over last 10%)
    startup_s: float
    train_s: float
    total_s: float
    metrics_path: str
    checkpoint: str | None


class WorkerDied(RuntimeError):
    pass


def _log(msg: str, bar=None) -> None:
    if bar is not None:
        bar.write(msg, file=sys.stderr)
    else:
        print(msg, file=sys.stderr, flush=True)


def _run_name(config) -> str:
    if config.run_name:
        return config.run_name
    spec = config.advantage_estimator.replace(":", "_").replace(".", "_")
    return f"{spec}_seed{config.seed}"


def output_dir_of(config) -> Path:
    return Path(config.output_dir) if config.output_dir else Path("outputs") / _run_name(config)


# -- checkpoints ----------------------------------------------------------------------------------


def checkpoint_path(out: Path, step: int) -> Path:
    return out / "checkpoints" / f"step_{step:06d}" / "state.pt"


def resolve_checkpoint(path: str) -> Path:
    """``--load``: a ``state.pt``, a ``step_*`` directory, or a run directory (its latest checkpoint)."""
    p = Path(path)
    if p.is_file():
        return p
    if (p / "state.pt").is_file():
        return p / "state.pt"
    steps = sorted((p / "checkpoints").glob("step_*/state.pt"))
    if steps:
        return steps[-1]
    raise FileNotFoundError(
        f"--load {path}: no checkpoint found (expected a state.pt, a checkpoints/step_* directory, or a run "
        "directory containing checkpoints/); save one with --save-interval"
    )


# -- Ray plumbing ---------------------------------------------------------------------------------


def _runtime_env(config) -> dict:
    """Workers must import what the driver imports, including a user's ``my_pkg.my_mod:MyAlgo``
    from the current directory: locally through PYTHONPATH, on a remote cluster by shipping the
    working directory."""
    cwd = os.getcwd()
    env = {k: os.environ.get(k, v) for k, v in RAY_ENV_DEFAULTS.items()}
    paths = [cwd] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    runtime_env = {"env_vars": env}
    if config.ray_address:
        runtime_env["working_dir"] = cwd
        runtime_env["excludes"] = ["outputs/", ".git/", "*.pt", "__pycache__/", ".tox/", "*.egg-info/"]
    return runtime_env


def _start_ray(config) -> bool:
    """Start a local Ray or join ``ray_address``; returns True when this call started/joined it."""
    apply_environment_defaults()
    import ray

    if ray.is_initialized():
        return False  # e.g. the test session's shared cluster: use it, leave it running
    # Worker logs reach the driver (errors must be visible); Ray's and Serve's INFO chatter does not.
    kwargs = {"include_dashboard": False, "log_to_driver": True, "logging_level": "WARNING",
              "runtime_env": _runtime_env(config)}
    if config.ray_address:
        ray.init(address=config.ray_address, **kwargs)
    else:
        # TransferQueue's controller and storage unit each ask for a whole CPU: more logical CPUs
        # than cores (the note's workaround 1); the workers ask for a fraction each.
        cpus = max(4, os.cpu_count() or 1, 2 + WORKER_CPUS * (config.actor_num_workers + 4))
        ray.init(num_cpus=int(cpus + 0.999), object_store_memory=512 * 2**20, **kwargs)
    return True


def _get(refs, what: str, timeout: float | None = None):
    """``ray.get`` that turns a dead worker into one clear error naming the role."""
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

    try:
        return ray.get(refs, timeout=timeout)
    except RayActorError as exc:
        raise WorkerDied(f"the {what} worker died: {exc}. See the worker log lines above.") from exc
    except RayTaskError as exc:
        cause = exc.as_instanceof_cause() if hasattr(exc, "as_instanceof_cause") else exc
        raise WorkerDied(f"the {what} worker failed: {type(cause).__name__}: {cause}") from exc
    except GetTimeoutError as exc:
        raise WorkerDied(
            f"the {what} worker did not answer within {timeout:.0f}s (not enough Ray CPUs for every worker, or "
            "stuck); check `ray status`"
        ) from exc


def gpu_requests(cluster_gpus: float, actor_workers: int) -> tuple[float, float]:
    """``(num_gpus per actor rank, num_gpus of the rollout)`` for a cluster with ``cluster_gpus`` GPUs.

    One GPU each when there are enough; a single actor rank shares one GPU with the rollout
    (half each); otherwise none is requested (CPU, or whatever devices the workers see) because two
    NCCL ranks must never share a GPU.
    """
    if cluster_gpus >= actor_workers + 1:
        return 1.0, 1.0
    if actor_workers == 1 and cluster_gpus >= 1:
        return 0.5, 0.5
    return 0.0, 0.0


def _free_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


class Runtime:
    """The live roles of one run (Ray actors, the Serve app, the data plane) and their teardown."""

    def __init__(self, config, algorithm_cls, layout: R.RoleLayout):
        self.config, self.algorithm_cls, self.layout = config, algorithm_cls, layout
        self.started_ray = False
        self.serve_app = None
        self.data_plane = None
        self.rollout = None
        self.actors: list = []
        self.critic = None
        self.adv_handle = None
        self._serve_error = "unknown error"
        self.startup_times: dict[str, float] = {}
        self.last_step: int | None = None

    def start(self) -> None:
        import ray

        from relax.runtime.actor_worker import ActorWorker, CriticWorker
        from relax.runtime.data_plane import TransferQueueDataPlane
        from relax.runtime.rollout_worker import RolloutWorker

        cfg, spec = self.config, self.config.advantage_estimator
        t0 = time.perf_counter()
        self.started_ray = _start_ray(cfg)
        self.startup_times["ray_init_s"] = time.perf_counter() - t0
        opts = {"num_cpus": WORKER_CPUS, "max_restarts": 0}
        w = cfg.actor_num_workers
        gpus = ray.cluster_resources().get("GPU", 0.0)
        actor_gpus, rollout_gpus = gpu_requests(gpus, w)
        if gpus and not actor_gpus:
            _log(f"relax: warning: {gpus:g} GPU(s) for {w} actor rank(s) + the rollout; requesting none "
                 "(NCCL ranks cannot share a GPU)")
        # Spawn every worker first: their processes start and import torch in parallel with the
        # TransferQueue and Serve start-up below.
        self.rollout = ray.remote(RolloutWorker).options(**opts, num_gpus=rollout_gpus).remote(cfg, spec)
        with_ref = R.REFERENCE in self.layout
        on_actor = self.layout.placement[R.ADVANTAGES] == R.ON_ACTOR
        self.actors = [
            ray.remote(ActorWorker).options(**opts, num_gpus=actor_gpus).remote(
                cfg, spec, r, w, with_reference=with_ref, advantages_on_actor=on_actor
            )
            for r in range(w)
        ]
        if R.CRITIC in self.layout:
            self.critic = ray.remote(CriticWorker).options(**opts).remote(cfg)
        serve_thread = None
        if not on_actor:
            serve_thread = threading.Thread(target=self._deploy_advantages, daemon=True)
            serve_thread.start()
        self.data_plane = TransferQueueDataPlane().start()
        self.startup_times["transferqueue_s"] = time.perf_counter() - t0 - self.startup_times["ray_init_s"]
        workers = [self.rollout, *self.actors] + ([self.critic] if self.critic else [])
        _get([x.attach.remote() for x in workers], "start-up", timeout=STARTUP_TIMEOUT_S)
        self.startup_times["workers_ready_s"] = time.perf_counter() - t0
        if w > 1:
            address = _get(self.actors[0].free_address.remote(), "actor")
            _get([a.init_process_group.remote(address) for a in self.actors], "actor", timeout=STARTUP_TIMEOUT_S)
        if serve_thread is not None:
            serve_thread.join()
            self.startup_times["serve_ready_s"] = self._serve_ready - t0
            if self.adv_handle is None:
                raise WorkerDied(f"the advantages deployment failed to start: {self._serve_error}")
            # rank 0 sends each step's request itself (see _Pipeline)
            _get(self.actors[0].set_advantages_service.remote(self.adv_handle), "actor")

    def _deploy_advantages(self) -> None:
        import logging

        from ray import serve

        from relax.runtime.advantages import APP_NAME, make_deployment

        logging.getLogger("ray.serve").setLevel(logging.WARNING)
        quiet = {"enable_access_log": False, "log_level": "WARNING"}
        try:
            serve.start(proxy_location="Disabled", logging_config=quiet)
            app = make_deployment().bind(self.config.advantage_estimator, self.config.algorithm)
            self.adv_handle = serve.run(app, name=APP_NAME, route_prefix=None, logging_config=quiet)
            self.serve_app = APP_NAME
            self._serve_ready = time.perf_counter()
        except Exception as exc:  # noqa: BLE001 - reported by start() on the main thread
            self._serve_error = f"{type(exc).__name__}: {exc}"

    def stop(self) -> None:
        import ray

        with contextlib.suppress(Exception):
            if self.serve_app is not None:
                from ray import serve

                serve.delete(self.serve_app)
                if self.started_ray:
                    serve.shutdown()
        for handle in [self.rollout, *self.actors, self.critic]:
            if handle is not None:
                with contextlib.suppress(Exception):
                    ray.kill(handle)
        with contextlib.suppress(Exception):
            if self.data_plane is not None:
                if self.last_step is not None:  # stopped mid-step: drop what the steps in flight wrote
                    for step in (self.last_step, self.last_step + 1):  # (matters when TQ outlives the run)
                        with contextlib.suppress(Exception):
                            if partition_name(step) in self.data_plane.client.get_partition_list():
                                self.data_plane.clear(step)
                self.data_plane.close()
        if self.started_ray:
            with contextlib.suppress(Exception):
                ray.shutdown()


# -- the loop -------------------------------------------------------------------------------------


def _short(key: str) -> str:
    return key[:4]


def run(config) -> RunSummary:
    """Train with ``config`` (a ``RunConfig``); returns a ``RunSummary``."""
    t_start = time.perf_counter()
    torch.set_num_threads(1)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # `relax train` is a console script: make the cwd importable
    algorithm_cls = load_algorithm(config.advantage_estimator)
    layout = R.derive_roles(algorithm_cls, config)
    out = output_dir_of(config)
    out.mkdir(parents=True, exist_ok=True)
    keys = tuple(config.algorithm.reward_keys)

    state, start_step = None, 0
    if config.load:
        ckpt = resolve_checkpoint(config.load)
        state = torch.load(ckpt, map_location="cpu", weights_only=False)
        check_checkpoint(config, state, config.load, has_critic=R.CRITIC in layout)
        start_step = int(state["step"])
        old_metrics = ckpt.parents[2] / "metrics.jsonl"
        new_metrics = out / "metrics.jsonl"
        if old_metrics.exists() and old_metrics.resolve() != new_metrics.resolve():
            new_metrics.write_text(old_metrics.read_text())
    log = MetricsLog(out / "metrics.jsonl", resume_after_step=start_step if state else None)

    _log(f"relax: {config.advantage_estimator} ({algorithm_cls.__module__}.{algorithm_cls.__qualname__}); "
         f"roles: {layout.describe()}; output: {out}")
    if not config.hf_checkpoint and state is None:
        with contextlib.suppress(Exception):
            from relax.rollout.tiny.warmup import warmup_base_rates

            rates = warmup_base_rates()
            _log("relax: warm-up base rates: " + ", ".join(f"{k} {v:.3f}" for k, v in rates.items()))

    runtime = Runtime(config, algorithm_cls, layout)
    last_ckpt = None
    bar = None
    steps_run = 0
    try:
        runtime.start()
        if state is not None:
            _restore(runtime, state)
            _log(f"relax: resumed from step {start_step} ({config.load})")
        t_ready = time.perf_counter()
        _log(f"relax: start-up {t_ready - t_start:.1f}s (" + ", ".join(
            f"{k} {v:.1f}" for k, v in runtime.startup_times.items()) + ")")
        from tqdm import tqdm

        bar = tqdm(
            range(start_step, config.num_rollout), desc="train", unit="step", disable=not config.progress,
            initial=start_step, total=config.num_rollout, file=sys.stderr, dynamic_ncols=True,
        )
        pipeline = _Pipeline(runtime, keys)
        for index in bar:
            step = index + 1
            runtime.last_step = step
            # The final step is saved whenever checkpoints are on, and always with --hf-checkpoint
            # (the trained model in Hugging Face format is the point of such a run).
            final = step == config.num_rollout
            saving = (bool(config.save_interval) and (step % config.save_interval == 0 or final)) or (
                bool(config.hf_checkpoint) and final
            )
            row = pipeline.step(step, prefetch_next=step < config.num_rollout and not saving)
            runtime.last_step = None  # the pipeline drops the finished step's partition itself
            log.write(row)
            steps_run += 1
            bar.set_postfix({_short(k): f"{row.get(f'reward/{k}/mean', float('nan')):.2f}" for k in keys}, refresh=False)
            if saving:
                last_ckpt = _save(runtime, out, step)
        pipeline.close()
        bar.close()
        t_end = time.perf_counter()
        table, stats = summary_table(log.rows, keys)
        _log("\n" + table)
        _log(f"relax: {steps_run} steps in {t_end - t_ready:.1f}s ({(t_end - t_ready) / max(steps_run, 1):.3f}s/step), "
             f"start-up {t_ready - t_start:.1f}s; metrics: {out / 'metrics.jsonl'}")
        return RunSummary(
            output_dir=str(out), steps_run=steps_run, last_step=start_step + steps_run, reward_first_last=stats,
            startup_s=t_ready - t_start, train_s=t_end - t_ready, total_s=t_end - t_start,
            metrics_path=str(out / "metrics.jsonl"), checkpoint=str(last_ckpt) if last_ckpt else None,
        )
    except KeyboardInterrupt:
        _log("relax: interrupted; shutting down the workers", bar)
        raise
    finally:
        if bar is not None:
            bar.close()
        runtime.stop()


class _Pipeline:
    """Submits whole steps and collects their results; the driver never sits between two roles.

    A step is a chain of Ray calls linked by object references: rollout -> [critic values,
    reference KL] -> actor ranks (+ critic training). Each worker receives the rollout's result
    and derives the same mini-batch plan from it; actor rank 0 sends the advantages request to the
    Serve deployment itself and computes the old log-probs while the deployment works. The next
    step's rollout is submitted before this step's results are awaited, with the new-weights
    reference and this step's training results as arguments, so Ray starts it the moment training
    ends. (Not across a checkpoint: the rollout state saved must be the one after this step.)
    """

    def __init__(self, rt: Runtime, keys):
        from concurrent.futures import ThreadPoolExecutor

        self.rt, self.keys = rt, keys
        self.submitted: dict[int, dict] = {}
        self.weights = None  # reference to the newest weights (None: the rollout keeps its own)
        self.after: list = []  # the previous step's training results
        self.t_last = time.perf_counter()
        # Dropping a finished step's partition is off the critical path: a driver thread does it
        # while the next step runs (TransferQueue's client is thread-safe: it runs its own loop).
        self.clearer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="relax-clear")
        self.clearing = None

    def _submit(self, step: int) -> None:
        rt, cfg, layout = self.rt, self.rt.config, self.rt.layout
        roll = rt.rollout.step.remote(step, self.weights, *self.after)
        with_values = rt.critic is not None
        with_kl = R.REFERENCE in layout and cfg.algorithm.kl_in_reward
        on_actor = layout.placement[R.ADVANTAGES] == R.ON_ACTOR
        prep = []
        if with_kl and not on_actor:
            prep += [a.prepare_step.remote(step, roll) for a in rt.actors]
        if with_values:
            prep.append(rt.critic.values_step.remote(step, roll))
        # No dependency on `prep`: every read of values / KL (the deployment's, or the actor's own
        # with advantages on the actor) waits in the data plane until they are written, so the old
        # log-probs are computed while the critic works.
        outs = [a.train_step.options(num_returns=2).remote(step, roll, with_values, with_kl) for a in rt.actors]
        critic = [rt.critic.train_step.remote(step, roll)] if with_values else []
        train = [o[0] for o in outs] + critic
        new_weights = outs[0][1]
        self.submitted[step] = {"roll": roll, "prep": prep, "train": train, "t_submit": time.perf_counter()}
        self.weights, self.after = new_weights, train

    def _clear_later(self, step: int) -> None:
        if self.clearing is not None:
            self.clearing.result()  # surface an error of the previous clear here
        self.clearing = self.clearer.submit(self.rt.data_plane.clear, step)

    def step(self, step: int, prefetch_next: bool) -> dict:
        if step not in self.submitted:
            self._submit(step)
        if prefetch_next:
            self._submit(step + 1)
        refs = self.submitted.pop(step)
        roll = _get(refs["roll"], "rollout")
        t_roll = time.perf_counter()
        row = {"step": step, **roll["metrics"]}
        for part in _get(refs["prep"], "reference/critic"):
            row.update(part)
        results = _get(refs["train"], "actor/critic")
        now = time.perf_counter()
        self._clear_later(step)  # every consumer of this step is done
        # Each actor rank reports its shares of the loss metrics per optimizer step: sum them over
        # the data-parallel ranks (relax.runtime.actor_metrics). Other keys: rank 0's win.
        shares = [part.pop(STEP_METRICS_KEY, None) for part in results[: len(self.rt.actors)]]
        for part in reversed(results):
            row.update(part)
        combined = combine_actor_metrics([steps for steps in shares if steps is not None])
        row.update({f"actor/{k}": v for k, v in combined.items()})
        plan = plan_from_rollout(roll, num_minibatches(self.rt.config), len(self.rt.actors))
        if plan.num_groups == 0:
            row["train/skipped"] = 1  # every group was dropped: nothing trained, weights unchanged
        row.update({
            "time/rollout_s": roll["metrics"]["time/rollout/total_s"],
            "time/advantages_s": row.get("time/advantages/total_s", 0.0),
            "time/train_s": now - t_roll,  # from the rollout's result to the last training result
            "time/step_s": now - self.t_last,
        })
        self.t_last = now
        return row

    def close(self) -> None:
        if self.clearing is not None:
            self.clearing.result()
        self.clearer.shutdown(wait=True)


def _save(rt: Runtime, out: Path, step: int) -> Path:
    """``checkpoints/step_<k>/state.pt`` (+ ``hf/`` in Hugging Face format with ``--hf-checkpoint``)."""
    # Megatron gathers its state over all ranks (a collective): ask every rank, keep rank 0's.
    actors = rt.actors if rt.config.backend == "megatron" else rt.actors[:1]
    refs = [a.state_dict.remote() for a in actors] + [rt.rollout.state_dict.remote()]
    if rt.critic is not None:
        refs.append(rt.critic.state_dict.remote())
    parts = _get(refs, "checkpoint")
    actor, rollout, critic = parts[0], parts[len(actors)], parts[len(actors) + 1] if rt.critic else None
    state = {"step": step, "actor": actor, "rollout": rollout, "critic": critic,
             "advantage_estimator": rt.config.advantage_estimator, "backend": rt.config.backend}
    path = checkpoint_path(out, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)  # a crash mid-write never leaves a truncated checkpoint behind
    if rt.config.hf_checkpoint:
        from relax.rollout.hf.checkpoint import export_hf_checkpoint

        export_hf_checkpoint(actor["backend"]["model"], rt.config.hf_checkpoint, path.parent / "hf")
    return path


def checkpoint_backend(state: dict) -> str:
    """The ``--backend`` that wrote a checkpoint (older checkpoints: recognized by their layout)."""
    if "backend" in state:
        return state["backend"]
    return "megatron" if "format" in state["actor"]["backend"] else "torch"


def check_checkpoint(config, state: dict, source, *, has_critic: bool) -> None:
    """Refuse a checkpoint this run cannot continue, before any worker starts."""
    if (state["critic"] is None) == has_critic:
        raise ValueError(f"--load {source}: the checkpoint and this run disagree on whether a critic exists")
    if state["advantage_estimator"] != config.advantage_estimator:
        raise ValueError(
            f"--load {source}: the checkpoint was trained with --advantage-estimator "
            f"{state['advantage_estimator']!r}, this run uses {config.advantage_estimator!r}"
        )
    saved = checkpoint_backend(state)
    if saved != config.backend:
        raise ValueError(
            f"--load {source}: the checkpoint was written by --backend {saved}, this run uses --backend "
            f"{config.backend}; the two store weights and optimizer state differently. Resume with "
            f"--backend {saved}, or start a new run without --load"
        )


def _restore(rt: Runtime, state: dict) -> None:
    refs = [a.load_state_dict.remote(state["actor"]) for a in rt.actors]
    refs.append(rt.rollout.load_state_dict.remote(state["rollout"], state["actor"]["backend"]["model"]))
    if rt.critic is not None:
        refs.append(rt.critic.load_state_dict.remote(state["critic"]))
    _get(refs, "checkpoint restore")
