"""The nemesis: every fault on a running cluster, each through one audited call.

As in Blockade, each verb goes through `Nemesis.invoke`, which appends an
`invoke` record to the run's history before acting and an `ok` (with what was
actually done: the pid signalled, the rules installed) or `fail` (with why)
after. Nothing is injected without a record. As in Jepsen, partitions are data
(sim.core.partition) applied by one mechanism (the ApplyPartitions action).

A kind that declares its act (sim/core/faultkinds) is carried out by `carry_out`: its actions, one branch each
in `_carry`. What those branches call lives by what it acts on: sim/faults/processes.py (workers, the agent, a
checkpoint writer), sim/faults/containers.py (whole nodes, scale), sim/faults/disk.py (the checkpoint volume),
sim/faults/network.py (links, partitions); the faults in force in sim/faults/inforce.py. Heal is a kind too: its
action plans (sim/faults/heal.py), then this module's one loop acts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sim.core import faultkinds as kinds
from sim.core.errors import FaultError, SimError, UnsupportedFaultError, UsageError
from sim.core.faultkinds import (
    ApplyPartitions,
    CatchWriter,
    ClearLink,
    ContinueWorker,
    EndedWithNode,
    ExhaustMemory,
    FaultKind,
    FindIface,
    ForgetInForce,
    HealFaults,
    KillContainer,
    LimitCpu,
    LimitWrites,
    NetworkBack,
    NodeShell,
    PauseContainer,
    ReadCpuLimits,
    RemoveFile,
    RequireCkptStorage,
    RestartContainer,
    RunNodeScript,
    ScaleNodes,
    ShapeLink,
    Signal,
    StartContainer,
    StopContainer,
    Struck,
    Touch,
    Unpause,
    Wait,
    network,
)
from sim.core.faultkinds.disk import FILL_AT_MOST
from sim.core.faultkinds.process import OOM_HEADROOM
from sim.core.faultoptions import FaultOptions
from sim.core.history import FILE_NAME, History
from sim.core.nodes import node_order
from sim.engines.cluster import Cluster, ContainerInfo
from sim.engines.docker import ExecTimeout
from sim.engines.proctable import PROBE_ARGV, NodeProcesses, parse_probe
from sim.faults import nodescripts
from sim.faults.containers import ContainerFaults
from sim.faults.disk import DiskFaults
from sim.faults.heal import Action, EndAct, HealPlan, Keep, plan_heal
from sim.faults.inforce import FaultStore, InForce
from sim.faults.network import NetworkFaults
from sim.faults.processes import OOM_WITHIN_S, WRITER_POLL_S, ProcessFaults
from sim.faults.targets import ETCD
from sim.faults.verbbase import CPU_PERIOD_US, PROCESS_BOUND_FAULTS, SHARED_CKPT_DIR, _last

__all__ = [
    "CPU_PERIOD_US",
    "FILL_AT_MOST",
    "OOM_HEADROOM",
    "OOM_WITHIN_S",
    "PROCESS_BOUND_FAULTS",
    "SHARED_CKPT_DIR",
    "WRITER_POLL_S",
    "Nemesis",
]


class Nemesis(ProcessFaults, ContainerFaults, DiskFaults, NetworkFaults):
    def __init__(self, cluster: Cluster, *, history: History | None = None, seed: int | None = None):
        self.cluster = cluster
        self.docker = cluster.docker
        self.history = history or History(cluster.run_dir / FILE_NAME)
        self.seed = seed if seed is not None else random.SystemRandom().randrange(2**31)
        self.rng = random.Random(self.seed)
        self.store = FaultStore(cluster.state_dir / "faults.json")
        # Every fault id this nemesis recorded (its intent, before it acted): a run's cleanup heals these,
        # those interrupted mid-call included, whose call never returned their id.
        self.recorded: list[str] = []

    # --- the one audited call ----------------------------------------------------

    def invoke(self, fault: str, target: str | None, action: Callable[[], dict], **args) -> dict:
        # A fault that cannot work on this cluster's engine (multi-host Swarm): its capabilities say so.
        refused = self.docker.capabilities.fault_refusal(fault, target, self.cluster.name)
        if refused:
            raise UnsupportedFaultError(refused)
        op = uuid.uuid4().hex[:8]
        base = {"type": "fault", "op": op, "fault": fault, "target": target}
        self.history.append({**base, "phase": "invoke", "args": args})
        try:
            result = action() or {}
        except ExecTimeout as error:
            # It may still run in the container: outcome unknown (Jepsen's :info), not a failure.
            self.history.append({**base, "phase": "info", "error": str(error)})
            raise
        except SimError as error:
            self.history.append({**base, "phase": "fail", "error": str(error)})
            raise
        except BaseException as error:
            # Unknown outcome (Jepsen's :info): it may or may not have happened.
            self.history.append({**base, "phase": "info", "error": f"{type(error).__name__}: {error}"})
            raise
        self.history.append({**base, "phase": "ok", "result": result})
        return {"op": op, **result}

    # --- targets -------------------------------------------------------------------

    def resolve(self, target: str, *, allow_etcd: bool = True) -> str:
        """A node name, or a role: random (seeded), store-host, rank0, etcd."""
        infos = {c.node: c for c in self.cluster.containers()}
        if target == ETCD:
            if not allow_etcd:
                raise UsageError("target 'etcd': this fault acts on a node's training processes; name a node")
            if ETCD not in infos:
                raise UsageError(
                    f"target 'etcd': cluster '{self.cluster.name}' has no etcd (its backend is c10d/static)"
                )
            return ETCD
        if target == "random":
            live = sorted((c.node for c in infos.values() if c.role == "node" and c.state == "running"), key=node_order)
            if not live:
                raise FaultError(f"target 'random': no running node in cluster '{self.cluster.name}'")
            return self.rng.choice(live)
        if target == "store-host":
            spec = self.cluster.spec
            if spec is not None and spec.uses_etcd:
                raise UsageError("target 'store-host': with the etcd backends the store is etcd; target 'etcd' instead")
            return "node0"
        if target == "rank0":
            for info in sorted(infos.values(), key=lambda c: node_order(c.node)):
                if info.role == "node" and info.state == "running" and self.processes(info.node).group_rank == 0:
                    return info.node
            raise FaultError("target 'rank0': no running node has a worker group of rank 0 right now")
        if target not in infos:
            known = ", ".join(sorted(infos, key=node_order)) or "none"
            raise UsageError(
                f"target '{target}': no such node in cluster '{self.cluster.name}'; use one of {known}, "
                f"or random, store-host, rank0"
            )
        return target

    def processes(self, node: str) -> NodeProcesses:
        result = self.cluster.exec(
            node, *PROBE_ARGV
        )  # as the training user: root lacks CAP_SYS_PTRACE to read its environ
        if not result.ok:
            raise FaultError(f"{node}: cannot read its processes ({_last(result.stderr)}); is it running, not paused?")
        return parse_probe(result.stdout)

    def _info(self, node: str) -> ContainerInfo:
        return self.cluster.container(node)

    # --- a kind that declares its act (sim/core/faultkinds): intent, actions, outcome --------------------

    def carry_out(
        self, kind: FaultKind, options: FaultOptions, *, target: str | None = None, struck: Struck | None = None
    ) -> dict:
        """Inject a fault of a kind that declares its own act: its invoke record, what it strikes resolved, its
        intent claimed (a reversible kind: `sim faults` lists it before it acts, so an interrupted one is still
        healed), its actions carried out, its typed result the ok record. `target`: an entry's fixed one (etcd);
        `struck`: what it strikes, given (a partition as data: Nemesis.partition)."""
        act = kind.act
        self._carry_all(act.requires(options))  # refused before anything is recorded
        if struck is None and act.strikes == "links":  # a bad shape is refused before anything is recorded
            struck = self._aim_links(act, options, target)
        args = act.recorded_args(options)
        if act.seeded:
            args["seed"] = self.seed

        def acting() -> dict:
            at = self._strike(act, options, target) if struck is None else self._present(kind, struck)
            problem = act.problem(dataclasses.replace(at, state=self._info(at.node).state)) if act.problem else None
            if problem:
                raise UsageError(problem)
            fault_id = kind.in_force_id_of(at)
            if fault_id is None:
                return act.result(options, at, self._carry_all(act.inject(options, at))).to_dict()
            at = dataclasses.replace(at, id=fault_id)
            fields = act.in_force_fields(options, at)
            kept: dict = {}

            def planned() -> dict:  # under the store's lock: what its undo restores, read before it acts
                record = {"fault": kind.in_force, "target": at.node, **fields, "detail": act.detail(options, at)}
                for outcome in self._carry_all(act.remembers(options, at)):
                    kept.update(outcome)
                return record | kept

            was = kind.in_force_ids_was(at.node)
            # The refusal names the id in force: an older sim's (`was`) where that one is.
            named = next((f.id for f in self.active() if f.id in was), fault_id) if was else fault_id
            try:
                with self._claimed(fault_id, act.refused(at, named), planned, was):
                    outcomes = self._carry_all(act.inject(options, dataclasses.replace(at, kept=kept)))
            except SimError as error:
                if act.undo_on_failure and not isinstance(error, ExecTimeout):  # its intent is forgotten
                    self._carry_all(act.undo(at))
                raise
            if act.in_force_after is not None:  # what it did, in place of its intent
                done = {"fault": kind.in_force, "target": at.node, **fields, "id": fault_id}
                self._remember(
                    {key: value for key, value in done.items() if key != "act"}
                    | act.in_force_after(options, at, outcomes)
                )
            return act.result(options, at, outcomes).to_dict()

        recorded = struck.node if struck is not None else act.recorded_target(options, target)
        return self.invoke(kind.name, recorded, acting, **args)

    def _carry_all(self, actions: Sequence[kinds.Action]) -> tuple[Any, ...]:
        return tuple(self._carry(action) for action in actions)

    def _carry(self, action: kinds.Action) -> Any:
        """One action of a kind's inject or undo; its outcome (a script's stdout, the pids signalled, ...)."""
        if isinstance(action, NodeShell):
            done = self.cluster.exec(action.node, "sh", "-c", action.script, "sh", *action.args)
            if done.exit_code in action.refusals:
                raise UnsupportedFaultError(f"{action.node}: {action.refusals[done.exit_code]}")
            if not done.ok:
                raise FaultError(f"{action.node}: {action.what} failed: {_last(done.stderr or done.stdout)}")
            return done.stdout
        if isinstance(action, LimitWrites):
            self.docker.limit_writes(self._info(action.node).id, action.path, action.bps)
            return ""
        if isinstance(action, Signal):
            self._signal(action.node, action.pid, action.signal)
            return ""
        if isinstance(action, ContinueWorker):
            return self._continue_workers(action)
        if isinstance(action, Touch):
            self._touch(action.node, action.file)
            return ""
        if isinstance(action, RemoveFile):
            self._remove_file(action.node, action.file)
            return ""
        if isinstance(action, ExhaustMemory):
            return self._exhaust_memory(action.node, action.pid, action.headroom)
        if isinstance(action, LimitCpu):
            self.docker.update_resources(
                self._info(action.node).id, cpu_quota=action.cpu_quota, cpu_period=action.cpu_period
            )
            return ""
        if isinstance(action, ReadCpuLimits):
            before = self.docker.resources(self._info(action.node).id)
            return {"cpu_quota": before.cpu_quota, "cpu_period": before.cpu_period}
        if isinstance(action, KillContainer):
            self.docker.kill(self._info(action.node).id, "SIGKILL")
            return ""
        if isinstance(action, StopContainer):
            return self._stop_container(action.node, action.grace)
        if isinstance(action, RestartContainer):
            self._restart_container(action.node, action.grace, action.downtime)
            return ""
        if isinstance(action, StartContainer):
            self.docker.start(self._info(action.node).id)
            return ""
        if isinstance(action, PauseContainer):
            self.docker.pause(self._info(action.node).id)
            return ""
        if isinstance(action, Unpause):
            self.docker.unpause(self._info(action.node).id)
            return ""
        if isinstance(action, RequireCkptStorage):
            self._require_own_ckpt_storage(action.directory)
            return ""
        if isinstance(action, RunNodeScript):
            args = (*action.args, self.rng.randrange(2**31)) if action.seeded else action.args
            script = nodescripts.NODE_SCRIPTS[action.script]
            return self._node_script(action.node, action.what, script, *args, act=action.act, hint=action.hint)
        if isinstance(action, CatchWriter):
            caught = self._signal_in_write(action.node, action.directory, action.within, action.signal, act=action.act)
            if action.pause_after:
                try:
                    self.docker.pause(self._info(action.node).id)
                except SimError:
                    self.cluster.exec(action.node, "kill", "-CONT", str(caught["pid"]))
                    raise
            return caught
        if isinstance(action, ScaleNodes):
            return self._scale_nodes(action.nodes, action.abrupt, action.grace)
        if isinstance(action, Wait):
            time.sleep(action.seconds)
            return ""
        if isinstance(action, EndedWithNode):
            self._forget_faults_of([action.node], PROCESS_BOUND_FAULTS)
            return ""
        if isinstance(action, NetworkBack):
            self._network_back(action.node)
            return ""
        if isinstance(action, ForgetInForce):
            undone = [f.id for f in self.active() if f.fault == action.in_force and f.target == action.node]
            for fault_id in undone:
                self._forget(fault_id)
            return undone
        if isinstance(action, ApplyPartitions):
            return self._apply_partitions()
        if isinstance(action, ShapeLink):
            return self._shape_link(action)
        if isinstance(action, FindIface):
            return {"iface": self._iface(action.node)}
        if isinstance(action, ClearLink):
            self._clear_link(action.node, quiet=action.quiet)
            return ""
        if isinstance(action, HealFaults):
            return self._heal(action.fault_id)
        raise TypeError(f"no executor for {action!r}")  # pragma: no cover - a new action without its branch

    # --- heal: a plan (sim/faults/heal.py), carried out by one loop ---------------------------

    def heal(self, fault_id: str | None = None) -> dict:
        """Undo one fault by id, or every reversible one (partitions, link faults, pauses). (faultkinds/network.py)"""
        return self.carry_out(network.HEAL, network.HealOptions(id=fault_id, all=fault_id is None))

    def _heal(self, fault_id: str | None) -> list[str]:
        """Heal's action: its plan from the faults in force and the containers' states, carried out; the
        partitions left in force applied once, at its end. What it could not undo is an error naming them."""
        active = self.active()
        chosen = active if fault_id is None else [f for f in active if f.id == fault_id]
        if fault_id is not None and not chosen:
            ids = ", ".join(f.id for f in active) or "none"
            raise UsageError(f"fault '{fault_id}': not in force (in force: {ids}); `sim faults` lists them")
        states = {c.node: c.state for c in self.cluster.containers()}
        healed, kept = self._execute(plan_heal(chosen, states, sweep=fault_id is None))
        self._carry(ApplyPartitions())
        if kept:
            raise FaultError(f"healed {', '.join(healed) or 'nothing'}; still in force: {'; '.join(kept)}")
        return healed

    def _execute(self, plan: HealPlan) -> tuple[list[str], list[str]]:
        """Carry out a heal plan: each undo's actions in order, then forget it; a fault kept, or one whose
        action fails (FaultError), stays in force. (ids healed, "id (why)" of those kept)."""
        healed, kept = [], []
        for step in plan.steps:
            if isinstance(step, Keep):
                kept.append(f"{step.fault_id} ({step.why})")
                continue
            try:
                for action in step.actions:
                    if not isinstance(action, ApplyPartitions):  # applied once, at the heal's end
                        self._act(action)
            except FaultError as error:
                kept.append(f"{step.fault_id} ({error})")
                continue
            self._forget(step.fault_id)
            healed.append(step.fault_id)
        if plan.sweep:
            # Heal what reality holds too, even if our record of it was lost.
            for info in self.cluster.containers():
                if info.state == "paused":
                    self.docker.unpause(info.id)
            for info in self.cluster.containers():
                if info.state == "running":
                    self._carry(ClearLink(info.node, quiet=True))
        return healed, kept

    def _act(self, action: Action) -> None:
        """One action of a heal plan."""
        if isinstance(action, EndAct):
            ended = self.cluster.exec(action.node, *nodescripts.argv(nodescripts.END_ACT, action.marker))
            if not ended.ok:
                raise FaultError(f"{action.node}: ending an interrupted fault's script failed: {_last(ended.stderr)}")
        elif isinstance(action, kinds.Action):  # a kind's own undo (sim/core/faultkinds)
            self._carry(action)
        else:  # pragma: no cover - a new action without its executor
            raise TypeError(f"heal: no executor for {action!r}")

    # --- faults in force (sim/faults/inforce.py: a small file beside the compose file) -------------

    def active(self) -> list[InForce]:
        return self.store.active()

    def _remember(self, fault: Mapping) -> None:
        self.recorded.append(fault["id"])
        self.store.remember(fault)

    def _claimed(
        self, fault_id: str, refusal: str | None, record: Callable[[], dict], was: Sequence[str] = ()
    ) -> contextlib.AbstractContextManager:
        """The fault's intent recorded before it acts (FaultStore.claimed)."""
        self.recorded.append(fault_id)
        return self.store.claimed(fault_id, refusal, record, was)

    def _forget(self, fault_id: str) -> None:
        self.store.forget(fault_id)

    def _forget_faults_of(
        self, nodes: Sequence[str], kinds: Sequence[str] | None, keep: Callable[[InForce], bool] = lambda f: False
    ) -> None:
        self.store.forget_faults_of(nodes, kinds, keep)
