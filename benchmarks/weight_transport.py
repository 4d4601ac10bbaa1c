"""Seconds per weight publish, ``--weight-transport object-store`` vs ``collective``, to 1 and 2 rollout workers.

The policy is a random Qwen2-shaped model (hidden 256, 6 layers, 4 heads / 2 KV heads, MLP 512,
vocabulary 32k, untied embeddings: ~20M parameters, built in memory by ``relax.models.hf.tiny_random``;
nothing is downloaded). One Ray actor plays actor rank 0 (it exports the weights as the torch backend
does, a copy on the CPU, and publishes them) and 1 or 2 Ray actors play rollout workers (each loads
what it receives into its own copy of the model). Both use the runtime's own transports
(``relax.runtime.weights.weight_sync.make_weight_sync``, the collective's group joined by its ``connect``) and
the pipeline's call shape: the publish's handle is passed, unresolved, to each worker's receive.

One publish: from the export on the sender to the last worker's ``load_weights`` having returned,
timed on the driver; the median over ``--repeats`` publishes after one warm-up publish. The two
transports take turns, publish by publish, so that a busy machine slows both alike. The workers'
weights are hashed after every publish (untimed), so the run also checks that both transports
deliver the same bytes. With a GPU for every actor the models sit on the GPUs and the group is NCCL; else gloo.

    python benchmarks/weight_transport.py [--repeats 10]
    python benchmarks/weight_transport.py --smoke     # a tiny model, 2 publishes each: for the test suite

The last line is JSON: ``{"params", "runs": {"<transport>_<N>w": {"publish_s", ...}}, "collective_over_object_store",
"identical"}``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import time

TRANSPORTS = ("object-store", "collective")
SHAPE = {"hidden": 256, "layers": 6, "vocab": 32_000}  # benchmarks/packing.py's ~20M-parameter Qwen2
SMOKE_SHAPE = {"hidden": 32, "layers": 1, "vocab": 512}


def _model(shape: dict, device: str):
    import torch
    from transformers import AutoModelForCausalLM

    from relax.models.hf.tiny_random import model_config

    torch.manual_seed(0)
    config = model_config("qwen2", shape["vocab"], hidden=shape["hidden"], layers=shape["layers"])
    return AutoModelForCausalLM.from_config(config).to(device)


def _worker_classes():
    import torch

    class End:
        """One process with its model and a transport per measured route (``route``: transport and
        worker count). A runtime worker gets its one transport at construction; here the processes
        are kept for all four routes, which their start-up would otherwise dominate."""

        def __init__(self, shape: dict, device: str):
            torch.set_num_threads(1)
            self.model, self.syncs = _model(shape, device), {}

        def use(self, route: str, weight_sync) -> bool:
            self.syncs[route] = weight_sync
            return True

        # what WeightSync.connect calls (relax.runtime.weights.weight_sync.JoinsWeightGroup), per route
        def open_weight_group(self, route: str):
            return self.syncs[route].open()

        def join_weight_group(self, route: str, group, rank: int) -> bool:
            self.syncs[route].join(group, rank)
            return True

        def device(self) -> str:
            """Where the model is, as a runtime worker reports it (the collective's group kind follows)."""
            from relax.runtime.step.placement import describe

            return describe(next(self.model.parameters()).device)

    class Sender(End):
        """Actor rank 0's end: a model that changes before every round, exported as TorchBackend does."""

        def params(self) -> int:
            return sum(p.numel() for p in self.model.parameters())

        def train(self, version: int) -> bool:
            with torch.no_grad():
                for p in self.model.parameters():
                    p.add_(1e-3 * version)
            return True

        def publish(self, route: str, version: int):
            weights = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}
            return self.syncs[route].publish(weights, version)

    class Receiver(End):
        """A rollout worker's end: the engine's ``load_weights`` is a ``load_state_dict`` into its model."""

        def load_weights(self, weights) -> None:
            self.model.load_state_dict(dict(weights), strict=True)

        def receive(self, route: str, version: int, handle) -> bool:
            self.syncs[route].receive(handle, self)
            self.syncs[route].forget_older(version)
            return True

        def digest(self) -> str:
            h = hashlib.sha256()
            for name, t in self.model.state_dict().items():
                h.update(name.encode())
                h.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
            return h.hexdigest()

    return Sender, Receiver


class _Route:
    """One end's methods bound to one route: what ``WeightSync.connect`` expects of a worker handle."""

    def __init__(self, handle, route: str):
        self.open_weight_group = _Bound(handle.open_weight_group, route)
        self.join_weight_group = _Bound(handle.join_weight_group, route)


class _Bound:
    def __init__(self, method, route: str):
        self.method, self.route = method, route

    def remote(self, *args):
        return self.method.remote(self.route, *args)


def measure(workers: int, sender, receivers: list, repeats: int) -> dict[str, dict]:
    """Both transports to ``workers`` rollout workers, publish by publish in turn (so a busy machine
    slows both alike); after each publish the workers' weights are hashed (untimed)."""
    import ray

    from relax.config.run import RunConfig
    from relax.runtime.weights.weight_sync import make_weight_sync

    receivers = receivers[:workers]
    routes, times, digests = {}, {t: [] for t in TRANSPORTS}, {t: [] for t in TRANSPORTS}
    devices = ray.get([end.device.remote() for end in [sender, *receivers]])
    for transport in TRANSPORTS:
        route = f"{transport}_{workers}w"
        sync = make_weight_sync(RunConfig(weight_transport=transport))  # chosen once, handed to every end
        ray.get([end.use.remote(route, sync) for end in [sender, *receivers]])
        routes[transport] = sync.connect(_Route(sender, route), [_Route(r, route) for r in receivers], devices,
                                         ray.get) or "Ray's object store"
    for version in range(1, repeats + 2):  # the first round warms up (allocations, the NCCL communicator)
        ray.get(sender.train.remote(version))
        for transport in TRANSPORTS:
            route = f"{transport}_{workers}w"
            t0 = time.perf_counter()
            handle = sender.publish.remote(route, version)
            ray.get([r.receive.remote(route, version, handle) for r in receivers])
            times[transport].append(time.perf_counter() - t0)
            digests[transport].append(ray.get([r.digest.remote() for r in receivers]))
    return {f"{t}_{workers}w": {"publish_s": statistics.median(times[t][1:]), "min_s": min(times[t][1:]),
                                "repeats": repeats, "route": routes[t], "digests": digests[t]} for t in TRANSPORTS}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--smoke", action="store_true", help="a tiny model, 2 publishes each: checks the script runs")
    args = parser.parse_args(argv)
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(include_dashboard=False, log_to_driver=False)
    shape, repeats = (SMOKE_SHAPE, 2) if args.smoke else (SHAPE, args.repeats)
    try:
        gpus = ray.cluster_resources().get("GPU", 0) >= 3  # a GPU per actor for the two-worker runs
        device = "cuda" if gpus else "cpu"
        Sender, Receiver = _worker_classes()
        opts = {"num_cpus": 0, "num_gpus": 1 if gpus else 0}
        sender = ray.remote(Sender).options(**opts).remote(shape, device)
        receivers = [ray.remote(Receiver).options(**opts).remote(shape, device) for _ in range(2)]
        params = ray.get(sender.params.remote())
        runs = {}
        try:
            for workers in (1, 2):
                for name, r in measure(workers, sender, receivers, repeats).items():
                    runs[name] = r
                    print(f"{name:>16}: {r['publish_s'] * 1e3:8.1f} ms per publish (min {r['min_s'] * 1e3:.1f} ms)",
                          flush=True)
        finally:
            for actor in [sender, *receivers]:
                ray.kill(actor)
    finally:
        if started:
            ray.shutdown()
    summary = {
        "params": params, "device": device,
        "runs": {k: {key: v for key, v in r.items() if key != "digests"} for k, r in runs.items()},
        "collective_over_object_store": {
            f"{w}w": runs[f"collective_{w}w"]["publish_s"] / runs[f"object-store_{w}w"]["publish_s"] for w in (1, 2)},
        # after every publish, every worker holds the same bytes with either transport
        "identical": all(runs[f"collective_{w}w"]["digests"] == runs[f"object-store_{w}w"]["digests"] for w in (1, 2))
        and all(len(set(d)) == 1 for r in runs.values() for d in r["digests"]),
    }
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
