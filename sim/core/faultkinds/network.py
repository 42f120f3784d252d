"""Network faults: links cut between nodes (partitions), a node's link degraded, and heal, which undoes any
reversible fault."""

from __future__ import annotations

from .base import FaultKind, Provocation

KINDS = (
    FaultKind(
        "partition",
        undo_op="heal",
        in_force="partition",
        loses_node=True,
        cuts_links=True,
        lane="partitioned",
        provocations={
            "partition": Provocation(
                "one node partitioned (<=20 s)",
                "partition",
                90,
                {"isolate": ("{victim}",)},
                duration_s=20.0,
                undone_once_regrouped=True,
                survival="the others time out and regroup; the node rejoins once healed",
                hosted_on=("etcd-v2", "etcd-v3"),
                cost_s=36.0,
            ),
        },
    ),
    FaultKind("heal", undoes=True),
    FaultKind(
        "link",
        undo_op="heal",
        in_force="link",
        degrading=True,
        lives_in_node=True,
        provocations={
            "netem": Provocation(
                "lossy link (10% loss, 10 s)",
                "netem",
                100,
                {"target": "{victim}", "loss": 10.0},
                duration_s=10.0,
                survival="training slows but carries on: no restart is needed, steps go on",
                cost_s=12.0,
            ),
        },
    ),
)
