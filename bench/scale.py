"""Scale on one machine: N nodes x 1 worker start, train, and survive the loss of a node.

    .venv/bin/python bench/scale.py                             # 8, 16, 32 nodes on etcd-v2 and c10d
    .venv/bin/python bench/scale.py --nodes 4 --backends c10d     # a smoke run
    .venv/bin/python bench/scale.py --nodes 4 --nproc-per-node 8  # the seed's 4 x 8 (32 trainers)

For each backend and node count, one generated scenario (the fast profile, the shipped trainer, one
worker a node unless --nproc-per-node): the last node is killed at step 30 (never node0, the c10d store
host), and the job must finish at N-1 nodes. Prints per run: seconds from the containers' start to the
first step, the node loss's recovery
(fault to the first step at the smaller world), memory per node while training (Docker's one-shot stats,
the median over samples of the mean over nodes), the host's busy cores on average over the run, the highest
1-minute load average, and the verdict. Writes the rows into bench/results.json under "scale". Asserts
nothing: where a size fails, its verdict's words say why. A rerun replaces the rows of the sizes it
measures and keeps the others.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import print_columns, save_results  # noqa: E402
from bench.scenario_runs import run_generated  # noqa: E402
from sim.core import labels  # noqa: E402
from sim.core.errors import SimError  # noqa: E402
from sim.core.history import FILE_NAME, History  # noqa: E402
from sim.core.spec import max_nodes_in_memory  # noqa: E402
from sim.engines.docker import Docker  # noqa: E402
from sim.scenarios.runner import default_cluster_name  # noqa: E402
from sim.verdict.runmodel import RunModel  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results.json"
KILL_AT_STEP = 30
SAMPLE_EVERY_S = 5.0


def scale_scenario(backend: str, nodes: int, nproc: int = 1) -> dict:
    return {
        "name": f"scale-{nodes}" if nproc == 1 else f"scale-{nodes}x{nproc}",
        "description": f"{nodes} nodes x {nproc} worker(s); node{nodes - 1} killed at step {KILL_AT_STEP}",
        "cluster": {
            "nodes": nodes,
            "min_nodes": nodes - 1,
            "max_nodes": nodes,
            "nproc_per_node": nproc,
            "max_restarts": 3,
            "rdzv_backend": backend,
        },
        "trainer": {"steps": KILL_AT_STEP + 60, "step_time": 0.1},
        "steps": [{"fault": "kill-node", "target": f"node{nodes - 1}", "at": {"step": KILL_AT_STEP}}],
        "expect": {"outcome": "recovers"},
        "timeout": f"{10 + nodes // 2}m",
    }


class Sampler:
    """Samples, every SAMPLE_EVERY_S while a run lasts, the memory of each node container of one cluster
    (Docker's one-shot stats) and the host's load average; and the host's busy cores over the whole run
    (/proc/stat: the machine's CPU, Docker's engine and the harness included, is what limits scale)."""

    def __init__(self, docker: Docker, cluster: str):
        self.docker, self.cluster = docker, cluster
        self.memory_per_node: list[float] = []  # MiB, the mean over node containers, per sample
        self.load: list[float] = []
        self.cores: float | None = None  # busy cores on average over the run
        self._cpu_begin = (0, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._cpu_begin = host_cpu_ticks()
        self._thread.start()
        return self

    def __exit__(self, *_) -> None:
        self._stop.set()
        self._thread.join()
        (busy0, all0), (busy1, all1) = self._cpu_begin, host_cpu_ticks()
        if all1 > all0:
            self.cores = (busy1 - busy0) / (all1 - all0) * (os.cpu_count() or 1)

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_EVERY_S):
            try:
                self._sample()
            except SimError:
                pass  # the cluster is coming up or going away: the next sample

    def _sample(self) -> None:
        self.load.append(os.getloadavg()[0])
        nodes = [c for c in self.docker.containers(labels.cluster_filter(self.cluster)) if c.state == "running"]
        used = []
        for container in nodes:
            if container.labels.get(labels.ROLE) != "node":
                continue
            try:
                stats = self.docker.api.stats(container.id, stream=False, one_shot=True)
            except Exception:  # noqa: BLE001 - gone between the list and the stats
                continue
            used.append(stats.get("memory_stats", {}).get("usage", 0) / 2**20)
        if used:
            self.memory_per_node.append(statistics.fmean(used))


def host_cpu_ticks() -> tuple[int, int]:
    """(busy, all) clock ticks of every CPU since boot, from /proc/stat's first line."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already in user
    return total - idle, total


def first_step_s(run: RunModel) -> float | None:
    """From the run's start record (the containers about to start) to the first training step."""
    if run.start is None or not run.step_beat_times:
        return None
    return run.step_beat_times[0] - run.start.t


def measure(backend: str, nodes: int, nproc: int, seed: int) -> dict:
    docker = Docker()
    document = scale_scenario(backend, nodes, nproc)
    with Sampler(docker, default_cluster_name(document["name"], backend)) as sampler:
        result, report = run_generated(document, backend, seed)
    run = RunModel(History(result.run_dir / FILE_NAME).records())
    recoveries = [r for r in report.get("recoveries", []) if r["fault"] == "kill-node"]
    recovery = recoveries[0]["recovery_s"] if recoveries else None
    return {
        "backend": backend,
        "nodes": nodes,
        "workers_per_node": nproc,
        "first_step_s": _round(first_step_s(run)),
        "node_loss_recovery_s": recovery,
        "memory_per_node_mib": _round(statistics.median(sampler.memory_per_node) if sampler.memory_per_node else None),
        "host_cores_busy": _round(sampler.cores),
        "load_max": _round(max(sampler.load, default=None)),
        "verdict": report["verdict"],
        "run": str(result.run_dir),
        "why": None if result.passed else result.summary.splitlines()[0:12],
    }


def size(row: dict) -> tuple:
    """What a scale row measures (older rows lack the workers a node: they had one)."""
    return row["backend"], row["nodes"], row.get("workers_per_node", 1)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="8,16,32", help="node counts, comma-separated")
    parser.add_argument("--backends", default="etcd-v2,c10d")
    parser.add_argument("--nproc-per-node", type=int, default=1, help="workers a node (default 1)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    counts = [int(n) for n in args.nodes.split(",")]
    nproc = args.nproc_per_node
    limit = max_nodes_in_memory(nproc)
    print(f"this machine holds at most {limit} nodes x {nproc} worker(s) by sim's memory estimate")
    rows = []
    for backend in args.backends.split(","):
        for nodes in counts:
            row = measure(backend, nodes, nproc, args.seed)
            rows.append(row)
            print(f"{backend} {nodes} nodes: {row['verdict']}")
            for line in row["why"] or []:
                print(f"  {line}")
    keys = (
        "backend",
        "nodes",
        "workers_per_node",
        "first_step_s",
        "node_loss_recovery_s",
        "memory_per_node_mib",
        "host_cores_busy",
    )
    keys += ("load_max", "verdict")
    print()
    print_columns([keys, *[tuple("-" if row[k] is None else str(row[k]) for k in keys) for row in rows]])
    save_results(RESULTS, "scale", rows, same=size)
    return 0 if all(row["verdict"] == "PASS" for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
