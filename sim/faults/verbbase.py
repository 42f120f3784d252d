"""What the nemesis's verb modules share: constants of the node and small helpers."""

from __future__ import annotations

from sim.core.faultkinds import in_force_kinds
from sim.core.faultkinds.container import CPU_PERIOD_US as CPU_PERIOD_US

# Faults in force that live in a node's processes or network namespace: they end when its container stops
# or restarts.
PROCESS_BOUND_FAULTS = in_force_kinds(lambda kind: kind.lives_in_node)
SHARED_CKPT_DIR = "/ckpt"  # where every node mounts the cluster's one checkpoint volume (compose/cluster.yaml)


def _last(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"
