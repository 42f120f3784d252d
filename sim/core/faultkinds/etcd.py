"""etcd faults of its own, all of it (etcd is also a target of the container faults: etcd-kill is kill-node
aimed at it, an Entry of that kind's act): wipe-etcd, asked for as `etcd-wipe`.

Its data is unlinked while etcd runs (it keeps its open files until it stops), so etcd is down no longer than a
plain restart, or for `downtime` seconds when given: every rendezvous key is gone.
"""

from __future__ import annotations

import dataclasses

from sim.core.faultoptions import SECONDS, FaultOptions, option
from sim.core.history import FaultResult

from .base import (
    Act,
    Entry,
    FaultKind,
    KillContainer,
    NetworkBack,
    NodeShell,
    PodChaos,
    RestartContainer,
    StartContainer,
    Wait,
)

ETCD = "etcd"  # the etcd container's node name (sim.faults.targets.ETCD)
_HELP = "restart etcd empty: every rendezvous key is gone"


@dataclasses.dataclass(frozen=True)
class WipeOptions(FaultOptions):
    downtime: float = option(SECONDS, "stay down this long before starting again", 0.0)


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class WipeResult(FaultResult):
    downtime: float | None = None


def _inject(o: WipeOptions, at) -> tuple:
    wipe = NodeShell(at.node, "rm -rf /var/lib/etcd/data", what="clearing its data")
    if o.downtime > 0:
        return (wipe, KillContainer(at.node), Wait(o.downtime), StartContainer(at.node), NetworkBack(at.node))
    return (wipe, RestartContainer(at.node, 0, 0), NetworkBack(at.node))


def _k8s(o: WipeOptions, target: str) -> PodChaos:
    return PodChaos(
        "pod-kill",
        ETCD,
        "etcd-wipe as PodChaos pod-kill of the etcd pod: its emptyDir goes with it, so the Deployment's new pod "
        f"starts empty{'; the downtime is not mapped' if o.downtime else ''}.",
    )


WIPE_ETCD = FaultKind(
    "wipe-etcd",
    act=Act(
        verb=(),  # asked for only as its entry, `sim etcd wipe`
        help=_HELP,
        options=WipeOptions,
        inject=_inject,
        result_type=WipeResult,
        result=lambda o, at, outcomes: WipeResult(node=at.node, downtime=o.downtime),
        detail=lambda o, at: "wiped",
        already="",
        undo=None,
        k8s=_k8s,
        example={"downtime": 3.0},
        entries=(
            Entry("etcd-wipe", ("etcd", "wipe"), "restart etcd empty: every rendezvous key is gone", WipeOptions, ETCD),
        ),
    ),
)
KINDS = (WIPE_ETCD,)
