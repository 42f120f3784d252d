"""Container faults: a whole node (or etcd) killed, stopped, restarted, started, frozen, slowed, or the node
count changed."""

from __future__ import annotations

from .base import FaultKind, Provocation

_ETCD = ("etcd-v2", "etcd-v3")
_REGROUP = "the others regroup without the node and train on"
_LOST = {"removes_node": True, "silences_node": True, "ends_workers": True, "loses_node": True}

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
    FaultKind(
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
    ),
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
