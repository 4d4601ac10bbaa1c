"""A worker's death that reaches the driver as its peer's error is reported as that worker's death
(issue 25, item 9: when one of two actor ranks dies, the survivor's gloo error used to be the line)."""

from __future__ import annotations

import pytest

from relax.runtime.session import heartbeat, waits


@pytest.mark.ray
@pytest.mark.timeout(120)
def test_the_dead_peer_is_named_not_the_survivor_whose_call_failed(ray_cluster):
    import ray

    @ray.remote(num_cpus=0)
    class Rank:
        def all_reduce(self):  # what a survivor of a collective reports when its peer is gone
            raise RuntimeError("[gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:4242")

    survivor, peer = Rank.remote(), Rank.remote()
    ray.get([survivor.__ray_ready__.remote(), peer.__ray_ready__.remote()])
    beats = heartbeat.Heartbeats(timeout=60.0)
    beats.workers = [heartbeat.Worker("actor rank 0", survivor, "k0"), heartbeat.Worker("actor rank 1", peer, "k1")]
    waits.watch_heartbeats(beats)
    try:
        # every worker alive: the failed call is the survivor's own failure, as before
        with pytest.raises(waits.WorkerDied, match=r"^the actor/critic worker failed: RayTaskError\(RuntimeError\): (?s:.*)Connection closed"):
            waits.get(survivor.all_reduce.remote(), "actor/critic")
        ray.kill(peer)
        with pytest.raises(waits.WorkerDied, match=r"^the actor rank 1 \(pid unknown\) died, and the actor/critic "
                                                   r"worker failed after it \(RuntimeError\)"):
            waits.get(survivor.all_reduce.remote(), "actor/critic")
    finally:
        waits.watch_heartbeats(None)
        ray.kill(survivor)
