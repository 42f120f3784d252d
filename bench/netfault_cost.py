"""What applying a network fault from the helper container costs, printed, never asserted.

Network faults run iptables/tc/ip in a short-lived helper container that joins the node's network
namespace (sim.engines.cluster.Cluster.net_exec), so a team's image needs none of those tools. This
times each fault's apply and its heal (by id, as a scenario's duration ends it; and `heal --all`),
through the helper and, for comparison, through `docker exec` in the node itself (the way before,
which needs the tools in the node's image), interleaved, on a 2-node etcd-v2 cluster of our images;
medians of --reps repetitions per side.

Usage: .venv/bin/python bench/netfault_cost.py [--reps 5]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import quiet  # noqa: E402
from sim.core.history import History  # noqa: E402
from sim.core.spec import ClusterSpec  # noqa: E402
from sim.engines import cluster as cluster_mod  # noqa: E402
from sim.engines.docker import Docker  # noqa: E402
from sim.faults.nemesis import Nemesis  # noqa: E402
from sim.faults.partition import isolate  # noqa: E402

FAULTS = {
    "partition (isolate node1)": lambda nem: nem.partition(isolate(["node1"], ["node0", "node1", "etcd"])),
    "netem --loss 10%": lambda nem: nem.link("node1", loss_pct=10),
    "netem --rate 1mbit": lambda nem: nem.link("node1", rate_bps=1_000_000),
}


def in_node(self, node: str, *argv: str, timeout: float = 30):
    """The way before: the command in the node's own image, by docker exec as root."""
    return self.exec(node, *argv, user="root", timeout=timeout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    docker = Docker()
    spec = ClusterSpec(name="bench-netfault-cost", nodes=2, nproc_per_node=1, script_args=("--steps", "100000"))
    cluster = cluster_mod.up(spec, docker, progress=quiet)
    helper = cluster_mod.Cluster.net_exec
    times: dict[tuple[str, str, str], list[float]] = {}
    try:
        nem = Nemesis(cluster, history=History(cluster.run_dir / "bench-netfault-cost.jsonl"), seed=1)
        for _ in range(args.reps):
            for way, method in (("helper", helper), ("docker exec", in_node)):
                cluster_mod.Cluster.net_exec = method
                for fault, act in FAULTS.items():
                    start = time.perf_counter()
                    done = act(nem)
                    applied = time.perf_counter()
                    nem.heal(done["id"])  # as a scenario's duration ends it
                    healed = time.perf_counter()
                    times.setdefault((fault, way, "apply"), []).append(applied - start)
                    times.setdefault((fault, way, "heal"), []).append(healed - applied)
                start = time.perf_counter()
                nem.heal()  # `sim heal --all`: every container's chains and qdiscs cleared, known faults or not
                times.setdefault(("heal --all, nothing in force", way, "heal"), []).append(time.perf_counter() - start)
    finally:
        cluster_mod.Cluster.net_exec = helper
        cluster.down(save_logs=False)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"{socket.gethostname()}, {when}, {args.reps} reps a side, interleaved; medians in ms")
    print(f"{'fault':<28} {'step':<6} {'helper':>8} {'exec':>8} {'added':>8}")
    rows = [(fault, step) for fault in FAULTS for step in ("apply", "heal")]
    for fault, step in [*rows, ("heal --all, nothing in force", "heal")]:
        ours = statistics.median(times[(fault, "helper", step)]) * 1000
        before = statistics.median(times[(fault, "docker exec", step)]) * 1000
        print(f"{fault:<28} {step:<6} {ours:8.0f} {before:8.0f} {ours - before:+8.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
