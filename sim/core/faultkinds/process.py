"""Process faults: a node's training processes (its workers, its torchrun agent)."""

from __future__ import annotations

from .base import FaultKind, Provocation

_REGROUP = "the others regroup without the node and train on"

KINDS = (
    FaultKind(
        "kill-worker",
        ends_workers=True,
        provocations={
            "kill-worker": Provocation("worker crash", "kill-worker", 10, {"target": "{victim}"}, quick=True),
        },
    ),
    FaultKind(
        "kill-agent",
        removes_node=True,
        silences_node=True,
        ends_workers=True,
        loses_node=True,
        provocations={
            "kill-agent": Provocation(
                "agent crash", "kill-agent", 20, {"target": "{victim}"}, nodes="less", survival=_REGROUP, cost_s=21.0
            ),
        },
    ),
    FaultKind("hang-worker", undo_op="heal", in_force="hang", lives_in_node=True, stalls_workers=True),
    FaultKind(
        "hang-collectives",
        undo_op="heal",
        in_force="stall",
        lives_in_node=True,
        stalls_workers=True,
        provocations={
            "hang-collectives": Provocation(
                "hung collective",
                "hang-collectives",
                140,
                {"target": "{victim}"},
                survival="the process-group timeout fires and the agents restart the group",
                quick=True,
                cost_s=19.0,
            ),
        },
    ),
    FaultKind("resume-worker", undoes=True, resumes_workers=True),
    FaultKind("oom-worker", ends_workers=True, ooms_worker=True),
)
