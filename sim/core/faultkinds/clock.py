"""Clock faults: a node's wall clock skewed (skew-clock), all of it: options, inject, undo, result, traits,
Chaos Mesh form.

Every process of a node preloads libfaketime, which reads the node's offset file (CLOCK_OFFSET_FILE, set in
the node's environment by sim.engines.render): a new process at once, a running one within 2 s. The monotonic
clock stays, as on a real machine. `heal` sets it back to 0.
"""

from __future__ import annotations

import dataclasses

from sim.core.errors import FaultError
from sim.core.faultoptions import NODE_TARGET, OFFSET, FaultOptions, option
from sim.core.history import FaultResult
from sim.core.parse import go_duration

from .base import Act, ChaosMesh, FaultKind, NodeShell

CLOCK_OFFSET_FILE = "/var/lib/elastic-sim/clock-offset"
# Write the offset ($1) to the node's offset file ($2), then a new process measures its clock against the
# kernel's (elastic_sim_clock.wall_clock). Exit CLOCK_NOT_PRELOADED: no libfaketime there.
CLOCK_NOT_PRELOADED = 3
CLOCK_SCRIPT = f"""case "$LD_PRELOAD" in *faketime*) ;; *) exit {CLOCK_NOT_PRELOADED} ;; esac
printf '%s\\n' "$1" > "$2"
exec python3 -c 'import time, elastic_sim_clock; print(time.time() - elastic_sim_clock.wall_clock())'"""
_NOT_PRELOADED = (
    "no libfaketime in its processes (a node image or cluster from before skew-clock); `sim down` and `sim up` again"
)


@dataclasses.dataclass(frozen=True)
class SkewOptions(FaultOptions):
    target: str = option(
        NODE_TARGET, "a node (node0, ...), or random (seeded), store-host, rank0", required=True, positional=True
    )
    by: float = option(OFFSET, "how far its clock runs ahead, e.g. 60s, or behind: --by=-10m", required=True)


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class SkewResult(FaultResult):
    """What skew-clock did: the offset asked for and the one a fresh process in the node then saw."""

    by: float | None = None
    seen: float | None = None


def _set_offset(node: str, seconds: float) -> NodeShell:
    return NodeShell(
        node,
        CLOCK_SCRIPT,
        (f"{seconds:+.3f}", CLOCK_OFFSET_FILE),
        "setting its clock",
        {CLOCK_NOT_PRELOADED: _NOT_PRELOADED},
    )


def _seen(node: str, outcome: str) -> float:
    try:
        return round(float(outcome.strip().splitlines()[-1]), 3)
    except (ValueError, IndexError):
        raise FaultError(f"{node}: setting its clock failed: {outcome.strip() or 'no output'}") from None


def _k8s(o: SkewOptions, target: str) -> ChaosMesh:
    offset = go_duration(o.by, signed=True)
    return ChaosMesh(
        "TimeChaos",
        {"timeOffset": offset, "clockIds": ["CLOCK_REALTIME"]},
        target,
        f"TimeChaos shifts the clock of the container's processes by {offset} (clockIds CLOCK_REALTIME); "
        "processes started later by `kubectl exec` keep the true time.",
    )


SKEW_CLOCK = FaultKind(
    "skew-clock",
    undo_op="heal",
    in_force="skew-clock",
    in_force_was=("skew",),
    degrading=True,
    skews_clock=True,
    act=Act(
        verb=("skew-clock",),
        help="shift a node's wall clock (libfaketime in its processes): --by 60s ahead, --by=-10m behind",
        options=SkewOptions,
        inject=lambda o, at: (_set_offset(at.node, o.by),),
        result_type=SkewResult,
        result=lambda o, at, outcomes: SkewResult(
            id=SKEW_CLOCK.in_force_id(at.node), node=at.node, by=o.by, seen=_seen(at.node, outcomes[0])
        ),
        detail=lambda o, at: f"clock {o.by:+g} s",
        already="its clock is skewed already",
        undo=lambda at: (_set_offset(at.node, 0),),
        k8s=_k8s,
        example={"target": "node1", "by": 60.0},
        allow_etcd=False,
    ),
)
KINDS = (SKEW_CLOCK,)
