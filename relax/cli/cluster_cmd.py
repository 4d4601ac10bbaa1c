"""``relax cluster up|down|status``: the kept cluster of the warm path (relax.runtime.cluster.kept_cluster)."""

from __future__ import annotations

import argparse
import sys


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    from relax.runtime.cluster.kept_cluster import DEFAULT_DIR, DEFAULT_PORT

    parser.add_argument("action", choices=("up", "down", "status"),
                        help="up: start it (Ray, Serve, TransferQueue, pre-started workers); down: stop it; "
                             "status: print its address")
    parser.add_argument("--temp-dir", default=DEFAULT_DIR,
                        help="the cluster's Ray temp dir; `down` stops exactly the processes of this one "
                             "(default: %(default)s)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="Ray's GCS port (default: %(default)s)")
    parser.add_argument("--num-cpus", type=int, default=8,
                        help="logical CPUs Ray schedules with (more than cores on small machines; "
                             "default: %(default)s)")
    parser.add_argument("--spare-workers", type=int, default=1,
                        help="pre-started rollout workers and actor ranks, each (0: none; default: %(default)s)")
    parser.add_argument("--node-ip-address", default="127.0.0.1",
                        help="the address other machines (or `--ray-address`) reach it at (default: %(default)s)")


def run_cluster(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from relax.runtime.cluster import kept_cluster

    if args.spare_workers < 0:
        parser.error(f"--spare-workers must be >= 0, got {args.spare_workers}")
    if args.action == "up":
        try:
            state = kept_cluster.up(args.temp_dir, num_cpus=args.num_cpus, spares=args.spare_workers,
                                    port=args.port, node_ip=args.node_ip_address)
        except kept_cluster.ClusterError as exc:
            print(f"relax cluster: error: {exc}", file=sys.stderr)
            return 1
        how = "already up" if state.get("already_up") else f"up in {state['startup_s']}s"
        print(f"relax: cluster {how} at {state['address']} (Ray, Serve, TransferQueue and "
              f"{state['spares']} pre-started rollout worker(s) and actor rank(s))\n"
              f"  train on it:  relax train --ray-address {state['address']} ...\n"
              f"  stop it:      relax cluster down" + ("" if args.temp_dir == kept_cluster.DEFAULT_DIR
                                                      else f" --temp-dir {args.temp_dir}"), file=sys.stderr)
        print(state["address"])  # stdout: the address alone, for scripts
        return 0
    if args.action == "down":
        stopped = kept_cluster.down(args.temp_dir)
        print(f"relax: cluster down ({stopped} process(es) stopped)" if stopped
              else f"relax: no cluster was running in {args.temp_dir}", file=sys.stderr)
        return 0
    state = kept_cluster.status(args.temp_dir)
    if state is None:
        print(f"relax: no cluster is up in {args.temp_dir} (start one: relax cluster up)", file=sys.stderr)
        return 1
    print(state["address"])
    return 0
