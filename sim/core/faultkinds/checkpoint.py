"""Checkpoint faults: the newest checkpoint damaged, its writer killed or frozen mid-write."""

from __future__ import annotations

from .base import FaultKind, Provocation

KINDS = (
    FaultKind("corrupt-checkpoint", damages_checkpoint=True),
    FaultKind(
        "kill-during-checkpoint",
        ends_workers=True,
        damages_checkpoint=True,
        strikes_in_write=True,
        provocations={
            "kill-during-checkpoint": Provocation(
                "kill during a checkpoint write",
                "kill-during-checkpoint",
                160,
                {"target": "rank0", "within": 30.0},
                survival="the half-written file is never loaded: the job resumes from the previous checkpoint",
                cost_s=7.0,
            ),
        },
    ),
    FaultKind(
        "freeze-during-checkpoint",
        undo_op="heal",
        in_force="freeze",
        silences_node=True,
        lives_in_node=True,
        freezes_node=True,
        holds_write_open=True,
    ),
)
