"""Container faults: a whole node (or etcd) killed, stopped, restarted, started, frozen, slowed, or the node
count changed."""

from __future__ import annotations

import dataclasses
from signal import SIGCONT, SIGSTOP

from sim.core.faultoptions import CPUS, FLAG, SECONDS, TARGET, FaultOptions, option, whole
from sim.core.history import FaultResult

from .base import (
    Act,
    ChaosMesh,
    CutFromJob,
    EndedWithNode,
    EndsHold,
    Entry,
    ExecTask,
    FaultKind,
    ForgetInForce,
    Held,
    KillContainer,
    LimitCpu,
    NetworkBack,
    NoOptions,
    PauseContainer,
    PodChaos,
    PodDown,
    Provocation,
    ReadCpuLimits,
    RestartContainer,
    ScaleJob,
    ScaleNodes,
    StartContainer,
    StopContainer,
    Struck,
    Unpause,
)

_ETCD = ("etcd-v2", "etcd-v3")
_REGROUP = "the others regroup without the node and train on"
_LOST = {"removes_node": True, "silences_node": True, "ends_workers": True, "loses_node": True}

CPU_PERIOD_US = 100_000  # the CFS period a CPU quota is a share of
_TARGET_HELP = "a node (node0, ...), or random (seeded), store-host, rank0, etcd"
_DOWNTIME_HELP = "stay down this long before starting again"
ETCD = "etcd"  # the etcd container's node name (sim.faults.targets.ETCD)
ETCD_CONTAINER = "etcd"  # its container's name in the exported etcd pod


# ---------------------------------------------------------------- options


@dataclasses.dataclass(frozen=True)
class TargetOptions(FaultOptions):
    target: str = option(TARGET, _TARGET_HELP, required=True, positional=True)


@dataclasses.dataclass(frozen=True)
class StopOptions(FaultOptions):
    target: str = option(TARGET, _TARGET_HELP, required=True, positional=True)
    grace: float = option(SECONDS, "seconds between SIGTERM and SIGKILL", 10.0)


@dataclasses.dataclass(frozen=True)
class RestartOptions(FaultOptions):
    target: str = option(TARGET, _TARGET_HELP, required=True, positional=True)
    grace: float = option(SECONDS, "grace period before the kill", 0.0)
    downtime: float = option(SECONDS, _DOWNTIME_HELP, 0.0)


@dataclasses.dataclass(frozen=True)
class ScaleOptions(FaultOptions):
    nodes: int = option(whole(0, 3), "run exactly node0..node{N-1}", required=True)
    abrupt: bool = option(FLAG, "removed nodes are killed, not stopped", False)
    grace: float = option(SECONDS, "grace period for a graceful removal", 10.0)


@dataclasses.dataclass(frozen=True)
class DowntimeOptions(FaultOptions):
    downtime: float = option(SECONDS, _DOWNTIME_HELP, 0.0)


# ---------------------------------------------------------------- results (the history's ok records)


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class NodeResult(FaultResult):
    """The node it acted on (FaultResult's node)."""


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class StopResult(FaultResult):
    grace: float | None = None  # seconds between SIGTERM and SIGKILL
    took: float | None = None  # seconds the stop took


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class RestartResult(FaultResult):
    grace: float | None = None
    downtime: float | None = None


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class ScaleResult(FaultResult):
    joined: tuple[str, ...] | None = None  # nodes started (new, or stopped ones started again)
    left: tuple[str, ...] | None = None  # nodes removed, highest first
    abrupt: bool | None = None


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class PauseResult(FaultResult):
    """The node paused, and its id in force (FaultResult's node and id)."""


# ---------------------------------------------------------------- Kubernetes


def _k8s_restart(o: RestartOptions | DowntimeOptions, target: str) -> PodChaos:
    if target == ETCD:
        note = f"etcd-restart's downtime {o.downtime:g}s is not mapped (the container restarts)." if o.downtime else ""
        return PodChaos("container-kill", ETCD, note, container=ETCD_CONTAINER)
    if o.downtime:
        return PodChaos(
            "pod-failure",
            target,
            f"downtime {o.downtime:g}s as PodChaos pod-failure for that long.",
            duration_s=o.downtime,
        )
    return PodChaos("pod-kill", target, grace=int(o.grace))


def _k8s_pause(o: TargetOptions | NoOptions, target: str) -> CutFromJob | Held:
    if target == ETCD:
        return CutFromJob(
            ETCD,
            "a frozen etcd as a NetworkChaos partition of the etcd pod (the etcd image has no shell to signal "
            "from): clients see it unresponsive, as when frozen.",
        )
    return Held(
        ExecTask("signal-all", target, (int(SIGSTOP),)),
        ExecTask("signal-all", target, (int(SIGCONT),)),
        "pause as a Task that SIGSTOPs every process of the pod but PID 1 (the kernel ignores SIGSTOP sent to a "
        "namespace's init): the agent keeps heartbeating, its workers freeze; locally docker pause freezes the "
        "agent too.",
    )


def _already_paused(at: Struck) -> str | None:
    return f"{at.node}: already paused; `sim unpause {at.node}` resumes it" if at.state == "paused" else None


def _not_paused(at: Struck) -> str | None:
    return None if at.state == "paused" else f"{at.node}: not paused (it is {at.state})"


# ---------------------------------------------------------------- the kinds

KILL_NODE_ACT = Act(
    verb=("kill",),
    help="crash a whole node or etcd at once (docker kill)",
    options=TargetOptions,
    inject=lambda o, at: (KillContainer(at.node), EndedWithNode(at.node)),
    result_type=NodeResult,
    result=lambda o, at, outcomes: NodeResult(node=at.node),
    detail=lambda o, at: "killed",
    already="",
    undo=None,
    k8s=lambda o, target: PodDown(target),
    example={"target": "node2"},
    args=lambda o: {},
    seeded=True,
    entries=(Entry("etcd-kill", ("etcd", "kill"), "crash etcd at once (docker kill)", NoOptions, ETCD),),
)
STOP_NODE_ACT = Act(
    verb=("stop",),
    help="preempt a node: SIGTERM, then SIGKILL after a grace period (docker stop -t)",
    options=StopOptions,
    inject=lambda o, at: (StopContainer(at.node, o.grace), EndedWithNode(at.node)),
    result_type=StopResult,
    result=lambda o, at, outcomes: StopResult(node=at.node, grace=o.grace, took=outcomes[0]),
    detail=lambda o, at: "stopped",
    already="",
    undo=None,
    k8s=lambda o, target: PodDown(target, grace=int(o.grace)),
    example={"target": "node1", "grace": 5.0},
    args=lambda o: {"grace": o.grace},
    seeded=True,
)
RESTART_NODE_ACT = Act(
    verb=("restart",),
    help="restart a node or etcd with the same hostname (quick rejoin; etcd keeps its data)",
    options=RestartOptions,
    inject=lambda o, at: (RestartContainer(at.node, getattr(o, "grace", 0.0), o.downtime), NetworkBack(at.node)),
    result_type=RestartResult,
    result=lambda o, at, outcomes: RestartResult(node=at.node, grace=getattr(o, "grace", 0.0), downtime=o.downtime),
    detail=lambda o, at: "restarted",
    already="",
    undo=None,
    k8s=_k8s_restart,
    example={"target": "node1", "grace": 1.0, "downtime": 2.0},
    args=lambda o: {"grace": getattr(o, "grace", 0.0), "downtime": o.downtime},
    seeded=True,
    entries=(Entry("etcd-restart", ("etcd", "restart"), "restart etcd, keeping its data", DowntimeOptions, ETCD),),
)
START_NODE_ACT = Act(
    verb=("start",),
    help="start a node or etcd that was killed or stopped",
    options=TargetOptions,
    inject=lambda o, at: (StartContainer(at.node), NetworkBack(at.node)),
    result_type=NodeResult,
    result=lambda o, at, outcomes: NodeResult(node=at.node),
    detail=lambda o, at: "started",
    already="",
    undo=None,
    k8s=lambda o, target: EndsHold("lost"),
    example={"target": "node1"},
    needs_running=False,
    entries=(Entry("etcd-start", ("etcd", "start"), "start etcd after a kill, keeping its data", NoOptions, ETCD),),
)
PAUSE_ACT = Act(
    verb=("pause",),
    help="freeze a node or etcd (every process stops; docker pause)",
    options=TargetOptions,
    inject=lambda o, at: (PauseContainer(at.node),),  # the intent first: a pause interrupted here is still healed
    result_type=PauseResult,
    result=lambda o, at, outcomes: PauseResult(id=f"pause-{at.node}", node=at.node),
    detail=lambda o, at: "frozen",
    already="already paused",
    undo=lambda at: (Unpause(at.node),),
    k8s=_k8s_pause,
    example={"target": "node1"},
    args=lambda o: {},
    seeded=True,
    refusal=lambda at, fault_id: None,  # `problem` refuses a paused node first
    problem=_already_paused,
    undo_while_paused=True,
    entries=(Entry("etcd-pause", ("etcd", "pause"), "freeze etcd", NoOptions, ETCD, undo_verb="etcd unpause"),),
)
SCALE_ACT = Act(
    verb=("scale",),
    help="add nodes that join the running job, or remove the highest ones",
    options=ScaleOptions,
    strikes="cluster",
    inject=lambda o, at: (ScaleNodes(o.nodes, o.abrupt, o.grace),),
    result_type=ScaleResult,
    result=lambda o, at, outcomes: ScaleResult(
        joined=tuple(outcomes[0]["joined"]), left=tuple(outcomes[0]["left"]), abrupt=o.abrupt
    ),
    detail=lambda o, at: f"{o.nodes} nodes",
    already="",
    undo=None,
    k8s=lambda o, target: ScaleJob(o.nodes),
    example={"nodes": 2, "abrupt": True, "grace": 3.0},
    target_of=lambda o: f"nodes={o.nodes}",
)
UNPAUSE_ACT = Act(
    verb=("unpause",),
    help="resume a frozen node or etcd",
    options=TargetOptions,
    inject=lambda o, at: (Unpause(at.node), ForgetInForce(at.node, "pause")),
    result_type=NodeResult,
    result=lambda o, at, outcomes: NodeResult(node=at.node),
    detail=lambda o, at: "thawed",
    already="",
    undo=None,
    k8s=lambda o, target: EndsHold(),
    example={"target": "node1"},
    problem=_not_paused,
    entries=(Entry("etcd-unpause", ("etcd", "unpause"), "resume a frozen etcd", NoOptions, ETCD),),
)


@dataclasses.dataclass(frozen=True)
class SlowOptions(FaultOptions):
    target: str = option(TARGET, _TARGET_HELP, required=True, positional=True)
    cpus: float = option(CPUS, "the CPU time it gets, in CPUs, e.g. 0.2 (a cgroup CPU quota)", required=True)


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class SlowResult(FaultResult):
    """What slow-node did: the node's CPU quota, of the period, for `cpus` CPUs."""

    cpus: float | None = None
    cpu_quota: int | None = None
    cpu_period: int | None = None


def _quota(cpus: float) -> int:
    return max(1000, round(cpus * CPU_PERIOD_US))  # the kernel's least quota is 1 ms


def _restore_cpu(at: Struck) -> tuple[LimitCpu, ...]:
    # Its own limits, as its in-force record kept them (no quota of its own: none).
    return (LimitCpu(at.node, at.kept.get("cpu_quota") or -1, at.kept.get("cpu_period") or CPU_PERIOD_US),)


def _k8s_slow(o: SlowOptions, target: str) -> ChaosMesh:
    load = max(1, min(100, round(100 * (1 - o.cpus))))
    return ChaosMesh(
        "StressChaos",
        {"stressors": {"cpu": {"workers": 1, "load": load}}},
        target,
        f"slow-node (a CPU quota of {o.cpus:g} CPUs) as StressChaos cpu load {load}%: Chaos Mesh adds competing "
        "load instead of capping the pod's CPU.",
        in_container=False,
    )


SLOW_NODE = FaultKind(
    "slow-node",
    undo_op="heal",
    in_force="slow-node",
    in_force_was=("slow",),
    degrading=True,
    slows_steps=True,
    provocations={
        "slow-node": Provocation(
            "straggler (0.05 CPU, 5 s)",
            "slow-node",
            130,
            {"target": "{victim}", "cpus": 0.05},
            duration_s=5.0,
            survival="every synchronous step slows, nothing fails: steps go on",
            cost_s=7.0,
        ),
    },
    act=Act(
        verb=("slow",),
        help="a straggler: throttle a node's (or etcd's) CPU with a cgroup quota",
        options=SlowOptions,
        inject=lambda o, at: (LimitCpu(at.node, _quota(o.cpus), CPU_PERIOD_US),),
        result_type=SlowResult,
        result=lambda o, at, outcomes: SlowResult(
            id=SLOW_NODE.in_force_id(at.node),
            node=at.node,
            cpus=o.cpus,
            cpu_quota=_quota(o.cpus),
            cpu_period=CPU_PERIOD_US,
        ),
        detail=lambda o, at: f"{o.cpus:g} CPUs",
        already="already slowed",
        undo=_restore_cpu,
        k8s=_k8s_slow,
        example={"target": "node1", "cpus": 0.25},
        undo_needs_running=False,
        undo_on_stopped=True,  # a stopped container's quota applies again at its start
        remembers=lambda o, at: (ReadCpuLimits(at.node),),
    ),
)

KINDS = (
    FaultKind(
        "kill-node",
        **_LOST,
        act=KILL_NODE_ACT,
        provocations={
            "kill-node": Provocation(
                "node crash",
                "kill-node",
                30,
                {"target": "{victim}"},
                nodes="less",
                survival=_REGROUP,
                quick=True,
                cost_s=17.0,
            ),
            "store-host-loss": Provocation(
                "c10d store host lost",
                "kill-node",
                120,
                {"target": "store-host"},
                survival="torch cannot survive it: every agent must end fast and cleanly",
                ends_job_on=("c10d",),
                hosted_on=("c10d",),
            ),
        },
    ),
    FaultKind(
        "stop-node",
        **_LOST,
        act=STOP_NODE_ACT,
        preempts=True,
        provocations={
            "stop-node": Provocation(
                "preemption (SIGTERM, 5 s grace)",
                "stop-node",
                40,
                {"target": "{victim}", "grace": 5.0},
                nodes="less",
                survival=_REGROUP,
            ),
        },
    ),
    FaultKind(
        "restart-node",
        act=RESTART_NODE_ACT,
        silences_node=True,
        ends_workers=True,
        loses_node=True,
        rejoins_nodes=True,
        provocations={
            "restart-node": Provocation(
                "node rejoin (restart)", "restart-node", 50, {"target": "{victim}"}, quick=True
            ),
            "etcd-restart": Provocation(
                "etcd restart (10 s down)",
                "etcd-restart",
                110,
                {"downtime": 10.0},
                survival="the agents ride out etcd's downtime and train on",
                ends_job_on=("etcd-v2",),
                hosted_on=_ETCD,
            ),
        },
    ),
    FaultKind("start-node", silences_node=True, act=START_NODE_ACT),
    FaultKind(
        "pause",
        act=PAUSE_ACT,
        undo_op="unpause",
        in_force="pause",
        silences_node=True,
        loses_node=True,
        lives_in_node=True,
        stalls_workers=True,
        freezes_node=True,
        provocations={
            "pause": Provocation(
                "freeze past keep-alive (<=25 s)",
                "pause",
                80,
                {"target": "{victim}"},
                duration_s=25.0,
                undone_once_regrouped=True,
                survival="the others time out, regroup, and the thawed node rejoins",
                cost_s=27.0,
            ),
        },
    ),
    FaultKind("unpause", undoes=True, resumes_workers=True, undoes_in_force="pause", act=UNPAUSE_ACT),
    SLOW_NODE,
    FaultKind(
        "scale",
        act=SCALE_ACT,
        rejoins_nodes=True,
        changes_node_count=True,
        provocations={
            "scale-down": Provocation(
                "a node leaving (scale down)",
                "scale",
                60,
                {"nodes": "{less}"},
                nodes="less",
                survival="the others regroup smaller and train on",
            ),
            "scale-up": Provocation(
                "a node joining (scale up)",
                "scale",
                70,
                {"nodes": "{more}"},
                nodes="more",
                survival="the new node joins at the next round and every rank trains from the same point",
                quick=True,
            ),
        },
    ),
)
KILL_NODE, STOP_NODE, RESTART_NODE, START_NODE, PAUSE, UNPAUSE, _, SCALE = KINDS
