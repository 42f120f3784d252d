"""Clock faults: a node's wall clock skewed."""

from __future__ import annotations

from .base import FaultKind

KINDS = (FaultKind("skew-clock", undo_op="heal", in_force="skew", degrading=True, skews_clock=True),)
