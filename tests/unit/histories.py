"""Hand-written histories, written as a run writes them (one clock, moving forward only): the one
builder the checker, report and any-script tests share.

HistoryBuilder writes what the shipped trainer and torch's agents record; ScriptRun what a plain
third-party script leaves (agents' events, Docker events and the instrumentation's worker records).
"""

from __future__ import annotations

from sim.verdict import Verdict
from sim.verdict.checkers import RunSpec, check_all
from sim.verdict.runmodel import RunModel

T0 = 1_700_000_000.0  # 22:13:20 UTC


def smooth_loss(step):
    return 2.0 / (1 + 0.1 * step)


class HistoryBuilder:
    """The shipped trainer's run: rendezvous rounds, trainer start/progress/checkpoint/summary lines."""

    def __init__(self, nodes=2, nproc=2, steps=30, ckpt=10, max_restarts=3, min_nodes=1, max_nodes=None):
        self.nproc, self.ckpt, self.target = nproc, ckpt, steps
        self.round, self.step, self.workers = 0, 0, []
        self._begin(
            nodes,
            max_restarts,
            profile="fast",
            target_steps=steps,
            ckpt_interval=ckpt,
            spec={"min_nodes": min_nodes, "max_nodes": max_nodes},
        )

    def _begin(self, nodes, max_restarts, *, spec, **run_fields):
        """The run start record and every node container's start."""
        self.records, self.t = [], T0
        self.nodes = [f"node{i}" for i in range(nodes)]
        self.restarts = {node: 0 for node in self.nodes}
        self.max_restarts = max_restarts
        self.add(
            type="run",
            event="start",
            **run_fields,
            spec={
                "name": "sim",
                "nodes": nodes,
                "nproc_per_node": self.nproc,
                "max_restarts": max_restarts,
                "rdzv_backend": "etcd-v2",
                **spec,
            },
        )
        for node in self.nodes:
            self.add(type="docker", node=node, action="start")

    def add(self, **record):
        self.records.append({"t": self.t, **record})

    def wait(self, seconds):
        self.t += seconds

    # --- what the trainer and its agents write ---

    def start_workers(self, resumed_from=0, nodes=None, agent_logs=True):
        """A rendezvous round (0.5 s), then the workers start 2 s later."""
        nodes = nodes or self.nodes
        self.round += 1
        if agent_logs:
            for group_rank, node in enumerate(nodes):
                self.add(
                    type="agent",
                    node=node,
                    event="rdzv_joined",
                    round=self.round,
                    group_rank=group_rank,
                    nodes=len(nodes),
                )
        self.wait(0.5)
        if agent_logs:
            for group_rank, node in enumerate(nodes):
                self.add(
                    type="agent",
                    node=node,
                    event="rdzv_complete",
                    restart_count=self.restarts.get(node, 0),
                    group_rank=group_rank,
                    group_world_size=len(nodes),
                    global_world_size=len(nodes) * self.nproc,
                )
        self.wait(2.0)
        world = len(nodes) * self.nproc
        self.workers = [
            (node, local, group_rank * self.nproc + local, world)
            for group_rank, node in enumerate(nodes)
            for local in range(self.nproc)
        ]
        for node, local, rank, _ in self.workers:
            self.trainer(
                node, local, rank, world, "start", resumed_from=resumed_from, ckpt_world_size=None, backend="gloo"
            )
        self.step = resumed_from

    def time_starts(self, import_s=1.0, pg_init_s=0.5, load_s=0.25):
        """Give the last start_workers' trainer start lines the times today's trainer adds: torch imported
        import_s after the rendezvous completed, the process group ready pg_init_s later, and the
        checkpoint load began load_s before the start line."""
        for record in self.records[-len(self.workers) :]:
            assert record.get("kind") == "start", "call right after start_workers"
            record["t_imported"] = record["t"] - 2.0 + import_s
            record["t_pg_ready"] = record["t_imported"] + pg_init_s
            record["t_ckpt_began"] = record["t"] - load_s

    def trainer(self, node, local_rank, rank, world, kind, **fields):
        self.add(
            type="trainer",
            node=node,
            kind=kind,
            rank=rank,
            local_rank=local_rank,
            world_size=world,
            restart=self.restarts.get(node, 0),
            run_id="sim",
            **fields,
        )

    def train(self, until, step_s=1.0, loss=smooth_loss):
        for step in range(self.step + 1, until + 1):
            self.wait(step_s)
            for node, local, rank, world in self.workers:
                self.trainer(node, local, rank, world, "progress", step=step, epoch=0, loss=loss(step))
            if step % self.ckpt == 0 or step == self.target:
                node, local, rank, world = self.workers[0]
                self.trainer(node, local, rank, world, "checkpoint", step=step, path=f"/ckpt/ckpt-{step:08d}.pt")
            self.step = step

    def finish(self, nodes=None, end=True):
        node, local, rank, world = self.workers[0]
        self.wait(0.5)
        self.trainer(
            node,
            local,
            rank,
            world,
            "summary",
            final_step=self.step,
            elapsed=self.t - T0,
            steps_run_this_start=self.step,
        )
        self.wait(1.0)
        for node in nodes or self.nodes:
            self.die(node, 0)
        if end:
            self.end()

    # --- faults, failures and the run's end, for any script ---

    def fault(self, fault, target, take_s=0.5, op=None, effects=(), **result):
        """A fault operation; `effects` are the records it causes before its ok (docker kill, die)."""
        op = op or f"op{len(self.records)}"
        self.add(type="fault", op=op, fault=fault, target=target, phase="invoke", args={})
        self.wait(take_s / 2)
        for effect in effects:
            self.add(**effect)
        self.wait(take_s / 2)
        self.add(type="fault", op=op, fault=fault, target=target, phase="ok", result=result)
        return self.t

    def group_failure(self, nodes=None):
        """Every agent sees its worker group fail and restarts it."""
        for node in nodes or self.nodes:
            left = self.max_restarts - self.restarts[node]
            self.add(type="agent", node=node, event="group_failed", attempts_left=left, max_restarts=self.max_restarts)
            self.restarts[node] += 1

    def die(self, node, exit_code):
        self.add(type="docker", node=node, action="die", exit_code=exit_code)

    def end(self):
        self.wait(1.0)
        self.add(type="run", event="end")

    # --- judging it ---

    def model(self) -> RunModel:
        return RunModel(self.records)

    def spec(self, **overrides) -> RunSpec:
        return RunSpec.from_run(self.model(), **overrides)

    def verdict(self, **overrides) -> Verdict:
        """What the real checkers say of the run (every checker for its expected outcome)."""
        return check_all(self.model(), self.spec(**overrides))


class ScriptRun(HistoryBuilder):
    """A plain script under sim: agents' events, Docker events and instrumentation records only."""

    def __init__(self, nodes=2, nproc=1, absolute_steps=False, log_progress=False, optimizer=True, losses=None):
        self.nproc = nproc
        self.absolute, self.log_progress, self.optimizer = absolute_steps, log_progress, optimizer
        self.losses = losses or (lambda step: 1.0 / step)
        self.pid, self.workers, self.step = 100, [], 0
        self._begin(
            nodes,
            3,
            profile="torch-defaults",
            target_steps=None,
            ckpt_interval=None,
            spec={"min_nodes": 1, "max_nodes": nodes, "script": "/u/train.py"},
        )

    def start_workers(self, resumed_from=0, nodes=None, collective=True):
        """Each node's agent starts its workers; `collective`: their first collective call (DDP's broadcast)."""
        nodes = nodes or self.nodes
        for rank, node in enumerate(nodes):
            self.add(
                type="agent",
                node=node,
                event="rdzv_complete",
                restart_count=self.restarts[node],
                group_rank=rank,
                group_world_size=len(nodes),
                global_world_size=len(nodes) * self.nproc,
            )
            self.add(type="agent", node=node, event="group_started")
        self.wait(2.0)
        world = len(nodes) * self.nproc
        self.workers = []
        for group_rank, node in enumerate(nodes):
            for local in range(self.nproc):
                self.pid += 1
                worker = dict(
                    node=node,
                    rank=group_rank * self.nproc + local,
                    local_rank=local,
                    world_size=world,
                    restart=self.restarts[node],
                    pid=self.pid,
                    run_id="r",
                )
                self.workers.append(worker)
                self.add(type="worker", event="start", **worker)
        self.wait(1.0)
        for worker in self.workers if collective else ():
            self.add(type="worker", event="activity", collectives=1, op="broadcast", **worker)
        self.step, self.n = resumed_from, 0

    def exit_before_training(self, code=0):
        """A script that returns before its training loop (a device check, its data not found): the workers start,
        import torch and exit with `code`, no step and no collective; with 0, every agent's group finishes."""
        self.start_workers(collective=False)
        for worker in self.workers:
            self.add(type="worker", event="imported", **worker)
        self.wait(0.3)
        if code == 0:
            self.finish()
            return
        for worker in self.workers:
            self.add(type="worker", event="exit", code=code, **worker)
        self.wait(1.0)
        for node in self.nodes:
            self.die(node, code)

    def train(self, until, step_s=1.0):
        for step in range(self.step + 1, until + 1):
            self.wait(step_s)
            self.n += 1
            for worker in self.workers:
                if self.optimizer:
                    self.add(type="worker", event="step", n=self.n, step=step if self.absolute else None, **worker)
                else:
                    self.add(type="worker", event="activity", collectives=self.n + 1, op="all_reduce", **worker)
            if self.log_progress:
                self.add(
                    type="worker",
                    event="progress",
                    source="log",
                    node=self.workers[0]["node"],
                    step=step,
                    loss=self.losses(step),
                )
            self.step = step

    def way_to_first_step(self, imported_s=0.3, pg_ready_s=0.6, loads=()):
        """The instrumentation's records of the current workers' way to their first step, at these
        seconds after their start: torch imported, init_process_group returned, and per (seconds after
        start, total seconds in loads so far) a "load" record. Call after start_workers; each record
        goes in its place in time."""
        started = max(r["t"] for r in self.records if r.get("type") == "worker" and r.get("event") == "start")
        for worker in self.workers:
            self._insert(started + imported_s, event="imported", **worker)
            for after, total in loads:
                self._insert(started + after, event="load", seconds=total, op="torch.load", **worker)
            self._insert(started + pg_ready_s, event="pg_ready", seconds=0.1, **worker)

    def _insert(self, t, **record):
        index = next((i for i, r in enumerate(self.records) if r["t"] > t), len(self.records))
        self.records.insert(index, {"t": t, "type": "worker", **record})

    def kill_worker(self, node):
        """Its worker is killed: every agent's group fails and restarts."""
        self.fault("kill-worker", node, take_s=0.3, op="k1", node=node)
        self.wait(1.0)
        self.add(type="agent", node=node, event="worker_failed", exitcode=-9, local_rank=0, pid=1)
        self.group_failure()
        self.wait(3.0)

    def finish(self):
        self.wait(0.5)
        for worker in self.workers:
            self.add(type="worker", event="exit", code=0, **worker)
        for node in self.nodes:
            self.add(type="agent", node=node, event="group_finished")
        self.wait(1.0)
        for node in self.nodes:
            self.die(node, 0)
        self.add(type="run", event="end")
