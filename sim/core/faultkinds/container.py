"""Container faults: a whole node (or etcd) killed, stopped, restarted, started, frozen, slowed, or the node
count changed."""

from __future__ import annotations

import dataclasses

from sim.core.faultoptions import CPUS, TARGET, FaultOptions, option

from .base import Act, ChaosMesh, FaultKind, LimitCpu, Provocation, ReadCpuLimits, Struck

_ETCD = ("etcd-v2", "etcd-v3")
_REGROUP = "the others regroup without the node and train on"
_LOST = {"removes_node": True, "silences_node": True, "ends_workers": True, "loses_node": True}

CPU_PERIOD_US = 100_000  # the CFS period a CPU quota is a share of
_TARGET_HELP = "a node (node0, ...), or random (seeded), store-host, rank0, etcd"


@dataclasses.dataclass(frozen=True)
class SlowOptions(FaultOptions):
    target: str = option(TARGET, _TARGET_HELP, required=True, positional=True)
    cpus: float = option(CPUS, "the CPU time it gets, in CPUs, e.g. 0.2 (a cgroup CPU quota)", required=True)


@dataclasses.dataclass(frozen=True)
class SlowResult:
    """What slow-node did: the node's CPU quota, of the period, for `cpus` CPUs."""

    id: str
    node: str
    cpus: float
    cpu_quota: int
    cpu_period: int

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _quota(cpus: float) -> int:
    return max(1000, round(cpus * CPU_PERIOD_US))  # the kernel's least quota is 1 ms


def _restore_cpu(at: Struck) -> tuple[LimitCpu, ...]:
    # Its own limits, as its in-force record kept them (no quota of its own: none).
    return (LimitCpu(at.node, at.kept.get("cpu_quota") or -1, at.kept.get("cpu_period") or CPU_PERIOD_US),)


def _k8s_slow(o: SlowOptions) -> ChaosMesh:
    load = max(1, min(100, round(100 * (1 - o.cpus))))
    return ChaosMesh(
        "StressChaos",
        {"stressors": {"cpu": {"workers": 1, "load": load}}},
        o.target,
        f"slow-node (a CPU quota of {o.cpus:g} CPUs) as StressChaos cpu load {load}%: Chaos Mesh adds competing "
        "load instead of capping the pod's CPU.",
        in_container=False,
    )


SLOW_NODE = FaultKind(
    "slow-node",
    undo_op="heal",
    in_force="slow",
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
        result=lambda o, at, outcomes: SlowResult(f"slow-{at.node}", at.node, o.cpus, _quota(o.cpus), CPU_PERIOD_US),
        detail=lambda o, at: f"{o.cpus:g} CPUs",
        already="already slowed",
        undo=_restore_cpu,
        k8s=_k8s_slow,
        example={"target": "node1", "cpus": 0.25},
        undo_needs_running=False,
        undo_on_stopped=True,  # a stopped container's quota applies again at its start
        remembers=lambda at: (ReadCpuLimits(at.node),),
    ),
)

KINDS = (
    FaultKind(
        "kill-node",
        **_LOST,
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
    FaultKind("start-node", silences_node=True),
    FaultKind(
        "pause",
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
    FaultKind("unpause", undoes=True, resumes_workers=True, undoes_in_force="pause"),
    SLOW_NODE,
    FaultKind(
        "scale",
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
