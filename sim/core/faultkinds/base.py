"""What a fault kind declares: its traits (read by the run model, checkers, recovery, timeline and diagnoses),
its lane, its in-force record and its provocation for `sim vet`. One object per kind, in its family's module
(sim/core/faultkinds/<family>.py); docs/ARCHITECTURE.md ("A fault kind is one module") says which part lives where.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from sim.core.faultoptions import FaultOptions

# What undoes a reversible fault: the operation the history records for its undo.
UNDO_OPS = ("heal", "unpause", "resume-worker")
# What a kind's node shows on the timeline's lane while it is in force, over what Docker and the agents show.
LANES = ("partitioned",)
# Node-count changes a vetted fault makes: "same", "less" (a node leaves), "more" (a node joins).
NODE_EFFECTS = ("same", "less", "more")


@dataclasses.dataclass(frozen=True)
class Provocation:
    """How `sim vet` provokes one kind of fault (sim/vet/gauntlet.py builds a scenario from these), when the job counts
    as recovered from it and what surviving it means. `fault` names the catalog's entry; `options` are its
    options, with "{victim}" standing for the node it strikes (never node0: on c10d it hosts the store)."""

    label: str  # what the scorecard calls it: "worker crash"
    fault: str  # a catalog entry's name (sim.faults.catalog.FAULTS)
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
    # restoring scale included): what splitting the kinds between clusters balances. None: sim.vet.gauntlet.TYPICAL_S.
    cost_s: float | None = None

    def __post_init__(self) -> None:
        if self.nodes not in NODE_EFFECTS:
            raise ValueError(f"provocation {self.label!r}: nodes {self.nodes!r} is not one of {NODE_EFFECTS}")


# ---------------------------------------------------------------- what a kind asks the executor to do

# A kind's inject and undo return actions: data the nemesis (sim/faults/nemesis.py, the executor) carries out
# inside its one audited call. A new mechanism is a new action here and its one branch in Nemesis._act.


@dataclasses.dataclass(frozen=True)
class NodeShell:
    """Run a shell script in a node, as root (`sh -c SCRIPT sh ARGS...`); its stdout is the outcome. An exit
    code in `refusals` means the fault cannot work there: its text is the error."""

    node: str
    script: str
    args: tuple[str, ...] = ()
    what: str = "acting"  # for the error: "setting its clock failed"
    refusals: Mapping[int, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class LimitWrites:
    """Throttle what a node writes to the block device under `path` (a mount inside it) to `bps` bytes a
    second; 0 lifts the limit. Its container's block-I/O cgroup holds it, so it ends with the container."""

    node: str
    path: str
    bps: int


Action = NodeShell | LimitWrites


@dataclasses.dataclass(frozen=True)
class ChaosMesh:
    """How a kind is exported to Kubernetes (sim/export/k8s.py): one Chaos Mesh object of `kind` for the step's
    hold, `spec` under it (the exporter adds the mode, the selector of `target` and, when `in_container`,
    the job's container), and the note that says how it differs from the local fault."""

    kind: str  # "TimeChaos"
    spec: Mapping[str, Any]
    target: str
    note: str
    in_container: bool = True


@dataclasses.dataclass(frozen=True)
class Act:
    """How a kind is asked for and what it does, as data and pure functions; the nemesis carries it out.

    `options`: its options (a FaultOptions dataclass; their `target` is the node it strikes). `inject(options,
    node)`: the actions that inject it on the resolved node. `result(options, node, outcomes)`: its typed result
    (`to_dict()` is the history's ok record) from each action's outcome. `detail(options)`: what `sim faults`
    shows while it is in force, `already`: why a second one on the same node is refused. `undo(node)`: the
    actions that end it. `k8s(options)`: its Chaos Mesh form, None where there is none."""

    verb: tuple[str, ...]  # on the CLI: ("skew-clock",) is `sim skew-clock`
    help: str  # one line
    options: type[FaultOptions]
    inject: Callable[[Any, str], tuple[Action, ...]]
    result: Callable[[Any, str, tuple[str, ...]], Any]
    detail: Callable[[Any], str]
    already: str
    undo: Callable[[str], tuple[Action, ...]] | None
    k8s: Callable[[Any], ChaosMesh | None]
    example: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # options as a scenario step gives them
    allow_etcd: bool = True  # False: it acts on a node's training processes, never etcd
    # Its undo needs the node running (a stopped node's is refused with what to do first); False: a stopped
    # or removed node ended it with its container.
    undo_needs_running: bool = True


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
    # A preemption: SIGTERM, then SIGKILL after a grace period (a job may save a checkpoint in the grace).
    preempts: bool = False
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
    # How it is asked for and what it does (options, inject, undo, result, Chaos Mesh form); None: a kind whose
    # verb is still a Nemesis method with its entry in sim/faults/catalog.py (docs/ARCHITECTURE.md says which).
    act: Act | None = None

    def __post_init__(self) -> None:
        if self.undo_op is not None and self.undo_op not in UNDO_OPS:
            raise ValueError(f"fault kind {self.name}: undo_op {self.undo_op!r} is not one of {UNDO_OPS}")
        if self.undo_op is not None and self.in_force is None:
            raise ValueError(f"fault kind {self.name}: reversible, so it needs its in-force kind")
        if self.lives_in_node and self.in_force is None:
            raise ValueError(f"fault kind {self.name}: lives_in_node says what ends it while in force")
        if self.removes_node and not (self.silences_node and self.ends_workers):
            raise ValueError(f"fault kind {self.name}: a node removed is a node silenced, its workers ended")
        if self.act is not None and (self.undo_op is None) != (self.act.undo is None):
            raise ValueError(f"fault kind {self.name}: an undo exactly when it is reversible")
        if self.lane is not None and self.lane not in LANES:
            raise ValueError(f"fault kind {self.name}: lane {self.lane!r} is not one of {LANES}")

    @property
    def holds_workers(self) -> bool:
        """While in force it holds its workers (stopped, frozen with their node, held before a collective), and
        with them every rank they train with: a step seen just after it is one already in flight, not training
        going on (sim.verdict.recovery)."""
        return self.stalls_workers or self.freezes_node

    @property
    def reversible(self) -> bool:
        return self.undo_op is not None

    def in_force_id(self, node: str) -> str | None:
        """The id `sim faults` and `sim heal` use for this fault on one node (a held or stalled worker's
        adds its pid: the nemesis's result holds it)."""
        return None if self.in_force is None else f"{self.in_force}-{node}"
