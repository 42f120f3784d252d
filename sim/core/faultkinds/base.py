"""What a fault kind declares: its traits (read by the run model, checkers, recovery, timeline and diagnoses),
its lane, its in-force record and its provocation for `sim vet`. One object per kind, in its family's module
(sim/core/faultkinds/<family>.py); docs/ARCHITECTURE.md ("A fault kind is one module") says which part lives where.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

# What undoes a reversible fault: the operation the history records for its undo.
UNDO_OPS = ("heal", "unpause", "resume-worker")
# What a kind's node shows on the timeline's lane while it is in force, over what Docker and the agents show.
LANES = ("partitioned",)
# Node-count changes a vetted fault makes: "same", "less" (a node leaves), "more" (a node joins).
NODE_EFFECTS = ("same", "less", "more")


@dataclasses.dataclass(frozen=True)
class Provocation:
    """How `sim vet` provokes one kind of fault (chaos/vet.py builds a scenario from these), when the job counts
    as recovered from it and what surviving it means. `fault` names the catalog's entry; `options` are its
    options, with "{victim}" standing for the node it strikes (never node0: on c10d it hosts the store)."""

    label: str  # what the scorecard calls it: "worker crash"
    fault: str  # a catalog entry's name (chaos.faults.FAULTS)
    order: int  # its place in the gauntlet (the vet runs them in this order)
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    duration_s: float | None = None  # reversible faults: undone after this long
    # Undone sooner, as soon as the others are steady without the node: what surviving it asks is shown then.
    undone_once_regrouped: bool = False
    nodes: str = "same"  # NODE_EFFECTS: the node count it leaves
    survival: str = "the job recovers: every rank trains again at the world size it should have"
    # Backends where the job ends by design: there it gets a cluster of its own, checked to end fast and cleanly.
    ends_job_on: tuple[str, ...] = ()
    hosted_on: tuple[str, ...] | None = None  # None: every backend
    needs_ckpt_disk: bool = False  # a size-limited /ckpt (ckpt_size)
    quick: bool = False  # one of `--quick`'s five most telling
    default: bool = True  # in the whole gauntlet (`sim vet` with no --faults); False: only when named
    # Seconds it typically adds to a gauntlet (bench/vet_time.py: the time from its fault to the next, a
    # restoring scale included): what splitting the kinds between clusters balances. None: chaos.vet.TYPICAL_S.
    cost_s: float | None = None

    def __post_init__(self) -> None:
        if self.nodes not in NODE_EFFECTS:
            raise ValueError(f"provocation {self.label!r}: nodes {self.nodes!r} is not one of {NODE_EFFECTS}")


@dataclasses.dataclass(frozen=True)
class FaultKind:
    """One kind of fault, as the history names it, with what the verdict layer and `sim vet` need to know of it.

    `undo_op`: the operation the history records for its undo (one of UNDO_OPS), None when nothing undoes it
    (a kill is over once it happened). `in_force`: the kind under which the fault store lists it while it is in
    force (`sim faults`, `sim heal ID`), None for a fault that is over at once. Its id there is
    `{in_force}-{node}` for a fault of one node; a partition's is the nemesis's own.
    """

    name: str
    undo_op: str | None = None
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
    # It stops workers without ending them (a pause, a held worker, a stalled collective).
    stalls_workers: bool = False
    # It lets stopped workers go on (an unpause, a resume).
    resumes_workers: bool = False
    # It freezes a whole node (every process of it stops).
    freezes_node: bool = False
    # It undoes, on its target, the fault listed in force under this kind (unpause: "pause").
    undoes_in_force: str | None = None
    # It cuts network links between nodes (its result names the cuts).
    cuts_links: bool = False
    # Nodes (re)join because of it: restarted, or added or removed by a scale (its result names them).
    rejoins_nodes: bool = False
    # It changes the node count (its result's joined and left).
    changes_node_count: bool = False
    # It slows every training step (a straggler's CPU): a "slowed" fault, not only a degraded one.
    slows_steps: bool = False
    # It strikes a worker while it writes a checkpoint (the write may have completed just before).
    strikes_in_write: bool = False
    # It holds a checkpoint write open while in force (the frozen writer finishes late, as a zombie).
    holds_write_open: bool = False
    # It fills the checkpoint disk (the next write fails with ENOSPC).
    fills_disk: bool = False
    # The kernel's OOM killer ends a worker because of it.
    ooms_worker: bool = False
    # It shifts its node's wall clock (its result's `by`).
    skews_clock: bool = False
    # What its node's lane shows while it is in force (one of LANES); None: Docker's and the agents' records
    # draw it (a kill, a pause) or it shows on no lane.
    lane: str | None = None
    # How `sim vet` provokes it, by the name `sim vet --faults` takes (most kinds one, some none or two).
    provocations: Mapping[str, Provocation] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.undo_op is not None and self.undo_op not in UNDO_OPS:
            raise ValueError(f"fault kind {self.name}: undo_op {self.undo_op!r} is not one of {UNDO_OPS}")
        if self.undo_op is not None and self.in_force is None:
            raise ValueError(f"fault kind {self.name}: reversible, so it needs its in-force kind")
        if self.lives_in_node and self.in_force is None:
            raise ValueError(f"fault kind {self.name}: lives_in_node says what ends it while in force")
        if self.removes_node and not (self.silences_node and self.ends_workers):
            raise ValueError(f"fault kind {self.name}: a node removed is a node silenced, its workers ended")
        if self.lane is not None and self.lane not in LANES:
            raise ValueError(f"fault kind {self.name}: lane {self.lane!r} is not one of {LANES}")

    @property
    def reversible(self) -> bool:
        return self.undo_op is not None

    def in_force_id(self, node: str) -> str | None:
        """The id `sim faults` and `sim heal` use for this fault on one node (a held or stalled worker's
        adds its pid: the nemesis's result holds it)."""
        return None if self.in_force is None else f"{self.in_force}-{node}"
