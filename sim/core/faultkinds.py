"""What each kind of fault is, once: the datum every layer reads.

A fault kind is named as the history records it (the `fault` field of a fault record, which the
nemesis writes through `invoke`). The fault catalog (chaos/faults.py) adds options and a verb and
says which kind each of its entries records: `etcd-kill` is the kind `kill-node` aimed at etcd,
`netem` the kind `link`. The run model, checkers, recovery, timeline, diagnoses and the nemesis
read the traits here, never a list of names of their own, so a new fault is one entry here plus
its catalog entry and verb (docs/ARCHITECTURE.md); tests/unit/test_faultkinds.py walks both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

# What undoes a reversible fault: the operation the history records for its undo.
UNDO_OPS = ("heal", "unpause", "resume-worker")


@dataclasses.dataclass(frozen=True)
class FaultKind:
    """One kind of fault, as the history names it, with what the verdict layer needs to know of it.

    `undone_by`: the operation that undoes it (one of UNDO_OPS), None when nothing does (a kill is
    over once it happened). `in_force`: the kind under which the fault store lists it while it is
    in force (`sim faults`, `sim heal ID`), None for a fault that is over at once. Its id there is
    `{in_force}-{node}` for a fault of one node; a partition's is the nemesis's own.
    """

    name: str
    undone_by: str | None = None
    in_force: str | None = None
    # It slows or degrades training without stopping it (a straggler, a lossy link, a skewed clock):
    # unless a restart follows, no recovery is timed.
    degrading: bool = False
    # It takes a whole node out on purpose (the agent is the container's main process).
    removes_node: bool = False
    # Its node's workers fall silent while it acts (taken out, restarted, frozen).
    silences_node: bool = False
    # It ends its node's (or one) worker process.
    ends_workers: bool = False
    # The other nodes lose this node for a while (a c10d store host's loss ends the job).
    loses_node: bool = False
    # It damages the newest checkpoint on purpose (the loader must reject it).
    damages_checkpoint: bool = False
    # While in force it lives in the node's processes or network namespace (a SIGSTOPped worker, a
    # pause, a link's qdisc): a kill, stop or restart of the node ends it with them.
    lives_in_node: bool = False
    # It undoes faults of other kinds rather than injecting one.
    undoes: bool = False
    # While in force it holds its workers (frozen, stopped, held before a collective), and with them every
    # rank they train with: a step seen just after it is one already in flight, not training going on.
    holds_workers: bool = False

    def __post_init__(self) -> None:
        if self.undone_by is not None and self.undone_by not in UNDO_OPS:
            raise ValueError(f"fault kind {self.name}: undone_by {self.undone_by!r} is not one of {UNDO_OPS}")
        if self.undone_by is not None and self.in_force is None:
            raise ValueError(f"fault kind {self.name}: reversible, so it needs its in-force kind")
        if self.holds_workers and not self.reversible:
            raise ValueError(
                f"fault kind {self.name}: holds_workers is for a fault that is undone (a kill is over at once)"
            )
        if self.lives_in_node and self.in_force is None:
            raise ValueError(f"fault kind {self.name}: lives_in_node says what ends it while in force")
        if self.removes_node and not (self.silences_node and self.ends_workers):
            raise ValueError(f"fault kind {self.name}: a node removed is a node silenced, its workers ended")

    @property
    def reversible(self) -> bool:
        return self.undone_by is not None

    def in_force_id(self, node: str) -> str | None:
        """The id `sim faults` and `sim heal` use for this fault on one node (a held or stalled worker's
        adds its pid: the nemesis's result holds it)."""
        return None if self.in_force is None else f"{self.in_force}-{node}"


FAULT_KINDS: tuple[FaultKind, ...] = (
    FaultKind("kill-worker", ends_workers=True),
    FaultKind("kill-agent", removes_node=True, silences_node=True, ends_workers=True, loses_node=True),
    FaultKind("kill-node", removes_node=True, silences_node=True, ends_workers=True, loses_node=True),
    FaultKind("stop-node", removes_node=True, silences_node=True, ends_workers=True, loses_node=True),
    FaultKind("restart-node", silences_node=True, ends_workers=True, loses_node=True),
    FaultKind("start-node", silences_node=True),
    FaultKind(
        "pause",
        undone_by="unpause",
        in_force="pause",
        silences_node=True,
        loses_node=True,
        lives_in_node=True,
        holds_workers=True,
    ),
    FaultKind("unpause", undoes=True),
    FaultKind("partition", undone_by="heal", in_force="partition", loses_node=True),
    FaultKind("heal", undoes=True),
    FaultKind("link", undone_by="heal", in_force="link", degrading=True, lives_in_node=True),
    FaultKind("wipe-etcd"),
    FaultKind("hang-worker", undone_by="heal", in_force="hang", lives_in_node=True, holds_workers=True),
    FaultKind("hang-collectives", undone_by="heal", in_force="stall", lives_in_node=True, holds_workers=True),
    FaultKind("resume-worker", undoes=True),
    FaultKind("slow-node", undone_by="heal", in_force="slow", degrading=True),
    FaultKind("skew-clock", undone_by="heal", in_force="skew", degrading=True),
    FaultKind("oom-worker", ends_workers=True),
    FaultKind("corrupt-checkpoint", damages_checkpoint=True),
    FaultKind("fill-disk", undone_by="heal", in_force="fill"),
    FaultKind("kill-during-checkpoint", ends_workers=True, damages_checkpoint=True),
    FaultKind(
        "freeze-during-checkpoint",
        undone_by="heal",
        in_force="freeze",
        silences_node=True,
        lives_in_node=True,
        holds_workers=True,
    ),
    FaultKind("scale"),
)
KINDS: dict[str, FaultKind] = {kind.name: kind for kind in FAULT_KINDS}
# A record of a kind this version does not know (a newer history): no trait, so nothing is assumed.
UNKNOWN = FaultKind("unknown")


def kind_of(name: str) -> FaultKind:
    """The kind a history record names; UNKNOWN for a name this version does not know."""
    return KINDS.get(name, UNKNOWN)


def names_where(trait: Callable[[FaultKind], bool]) -> tuple[str, ...]:
    """The history names of every kind with a trait, e.g. names_where(lambda k: k.damages_checkpoint)."""
    return tuple(kind.name for kind in FAULT_KINDS if trait(kind))


def in_force_kinds(trait: Callable[[FaultKind], bool]) -> tuple[str, ...]:
    """The fault store's kinds of every kind with a trait (what `sim faults` lists them as)."""
    return tuple(kind.in_force for kind in FAULT_KINDS if kind.in_force is not None and trait(kind))
