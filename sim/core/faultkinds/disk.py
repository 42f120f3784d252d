"""Disk faults: the cluster's checkpoint disk filled."""

from __future__ import annotations

from .base import FaultKind, Provocation

KINDS = (
    FaultKind(
        "fill-disk",
        undo_op="heal",
        in_force="fill",
        fills_disk=True,
        provocations={
            "fill-disk": Provocation(
                "full checkpoint disk (5 s)",
                "fill-disk",
                150,
                duration_s=5.0,
                survival="a failed write does not lose the last good checkpoint: training goes on or resumes from it",
                needs_ckpt_disk=True,
            ),
        },
    ),
)
