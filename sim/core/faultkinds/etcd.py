"""etcd faults of its own (etcd is also a target of the container faults: etcd-kill is kill-node aimed at it)."""

from __future__ import annotations

from .base import FaultKind

KINDS = (FaultKind("wipe-etcd"),)
