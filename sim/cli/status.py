"""`sim status`: one row per node, from Docker, the node's process table and its log."""

from __future__ import annotations

import dataclasses
import time

from sim.core.agentlog import node_facts, node_log_facts
from sim.core.history import FILE_NAME, AgentRecord, History, TrainerRecord, WorkerRecord
from sim.core.wait import Check
from sim.engines.cluster import Cluster
from sim.engines.proctable import PROBE_ARGV, parse_probe


@dataclasses.dataclass(frozen=True)
class NodeStatus:
    node: str
    state: str
    agent: str  # alive | gone | ? (paused: the process table cannot be read)
    workers: int | None
    round: int | None
    world_size: int | None
    restarts: int
    step: int | None


def cluster_status(cluster: Cluster) -> list[NodeStatus]:
    """Containers and processes from Docker now; rounds, steps and restarts from the run's history."""
    history_path = cluster.run_dir / FILE_NAME
    by_node: dict[str | None, list[AgentRecord | TrainerRecord | WorkerRecord]] = {}
    if history_path.exists():
        for record in sorted(History(history_path).records(), key=lambda r: r.t):
            if isinstance(record, (AgentRecord, TrainerRecord, WorkerRecord)):
                by_node.setdefault(record.node, []).append(record)
    rows = []
    for info in cluster.containers():
        if info.role != "node":
            rows.append(NodeStatus(info.node, info.state, "-", None, None, None, 0, None))
            continue
        agent, workers = "?", None
        if info.state == "running":
            probe = cluster.exec(info.node, *PROBE_ARGV)
            if probe.ok:
                procs = parse_probe(probe.stdout)
                agent, workers = ("alive" if procs.agent_pid else "gone"), len(procs.workers)
        elif info.state in ("exited", "dead", "created"):
            agent, workers = "gone", 0
        if by_node:
            facts = node_facts(by_node.get(info.node, []))
        else:  # a cluster started without a collector: read its log directly
            facts = node_log_facts(cluster.logs(info.node), info.node)
        world, step, restarts = facts.world_size, facts.step, facts.restarts
        for record in by_node.get(info.node, []):
            # Any script, instrumented: its workers' own records (the trainer's lines, where present, win).
            if isinstance(record, WorkerRecord) and facts.step is None:
                world = record.world_size if record.world_size is not None else world
                restarts = max(restarts, record.restart or 0)
                if record.event in ("step", "progress"):
                    step = record.step if record.step is not None else (record.n if record.n is not None else step)
        state = info.state if info.exit_code is None else f"exited({info.exit_code})"
        rows.append(NodeStatus(info.node, state, agent, workers, facts.round, world, restarts, step))
    return rows


def format_status(rows: list[NodeStatus]) -> str:
    header = f"{'NODE':<8} {'CONTAINER':<11} {'AGENT':<6} {'WORKERS':<8} {'ROUND':<6} {'WORLD':<6} {'RESTARTS':<9} STEP"
    lines = [header]
    for r in rows:

        def show(value: object) -> str:
            return "-" if value is None else str(value)

        lines.append(
            f"{r.node:<8} {r.state:<11} {r.agent:<6} {show(r.workers):<8} {show(r.round):<6} "
            f"{show(r.world_size):<6} {r.restarts:<9} {show(r.step)}"
        )
    return "\n".join(lines)


class StatusWatch:
    """`sim status --watch`: each poll redraws the table; done once the cluster is gone."""

    description = "watching the cluster"

    def __init__(self, cluster: Cluster):
        self.cluster = cluster

    def check(self) -> Check:
        if not self.cluster.containers():
            return Check(True)
        table = format_status(cluster_status(self.cluster))
        print(
            f"\033[H\033[J{time.strftime('%H:%M:%S')}  cluster '{self.cluster.name}'  (Ctrl-C to stop)\n{table}",
            flush=True,
        )
        return Check(False)
