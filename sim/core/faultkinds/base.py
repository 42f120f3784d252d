"""What a fault kind declares: its traits (read by the run model, checkers, recovery, timeline and diagnoses),
its lane, its in-force record and its provocation for `sim vet`. One object per kind, in its family's module
(sim/core/faultkinds/<family>.py); docs/ARCHITECTURE.md ("A fault kind is one module") says which part lives where.
"""

from __future__ import annotations

import dataclasses
import signal as signals
from collections.abc import Callable, Mapping
from typing import Any

from sim.core.faultoptions import FaultOptions
from sim.core.history import FaultResult
from sim.core.partition import Cut, Partition

# What undoes a reversible fault: the operation the history records for its undo.
UNDO_OPS = ("heal", "unpause", "resume-worker")
# What a kind's node shows on the timeline's lane while it is in force, over what Docker and the agents show.
LANES = ("partitioned",)
# Node-count changes a vetted fault makes: "same", "less" (a node leaves), "more" (a node joins).
NODE_EFFECTS = ("same", "less", "more")


@dataclasses.dataclass(frozen=True)
class NoOptions(FaultOptions):
    """The options of a kind, or an entry, that takes none (etcd-kill, etcd-isolate)."""


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
# inside its one audited call. A new mechanism is a new action here and its one branch in Nemesis._carry.

# The last argument of a fault's node script (RunNodeScript.act): heal ends an interrupted one by it.
ACT_MARKER = "elastic-sim-act={}"

# What a kind strikes, resolved by the executor from its options before it acts (Act.strikes): a node (its
# target), a worker of one (picked by the options' rank or local_rank, else at random, seeded), a node's
# torchrun agent, the cluster as a whole (a scale: its Struck names no node), or the node whose worker will write
# a checkpoint (rank0's is waited for while a restarted group has none yet; its Struck's `left`: the seconds left
# of the options' `within`), or the links between nodes its options cut (a partition: resolved among the cluster's
# nodes before anything is recorded, its Struck names them by its description and holds its cuts).
STRIKES = ("node", "worker", "agent", "cluster", "writer", "links")


@dataclasses.dataclass(frozen=True)
class Struck:
    """What a fault strikes, as the executor resolved it: a node, and the process of it a worker or agent kind
    strikes (its pid; a worker's ranks; the agent's workers). Heal builds one from the in-force record (its pid
    and file) to plan a kind's undo."""

    node: str
    pid: int | None = None
    rank: int | None = None
    local_rank: int | None = None
    workers: tuple[int, ...] = ()  # the agent's worker pids, when it strikes the agent
    file: str | None = None  # the in-force record's file (a held worker's hang file)
    # What its in-force record kept to undo it (Act.remembers: a CPU quota to restore, a link's interface).
    kept: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    state: str | None = None  # its container's state, when the act checks it (Act.problem)
    left: float | None = None  # a writer's: the seconds left to wait for its write
    cuts: frozenset[Cut] = frozenset()  # the links a partition cuts (its `node`: the partition's description)
    id: str | None = None  # its id in force, once the executor claimed it (a partition's is drawn at random)


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


@dataclasses.dataclass(frozen=True)
class Signal:
    """Send `signal` to one process of a node, as the node's own user (the one its agent and workers run as)."""

    node: str
    pid: int
    signal: signals.Signals


@dataclasses.dataclass(frozen=True)
class ContinueWorker:
    """SIGCONT a stopped worker of a node; it may be gone since: fine, unless `strict` (a signal that must
    be delivered). No pid: every worker of the node. Outcome: the pids signalled."""

    node: str
    pid: int | None
    strict: bool = False


@dataclasses.dataclass(frozen=True)
class Touch:
    """Create an empty file in a node (a flag its processes watch)."""

    node: str
    file: str


@dataclasses.dataclass(frozen=True)
class RemoveFile:
    node: str
    file: str


@dataclasses.dataclass(frozen=True)
class ExhaustMemory:
    """The kernel's OOM killer ends worker `pid`: its node's memory limited `headroom` bytes above its use
    for the while, the worker made its first choice, a hog allocating until it is gone. Outcome: what the hog
    saw (limit, allocated, limit_kept, oom_kills, hog_killed)."""

    node: str
    pid: int
    headroom: int


@dataclasses.dataclass(frozen=True)
class LimitCpu:
    """Give a node's container `cpu_quota` microseconds of CPU time every `cpu_period` (its cgroup's CFS
    quota, what `docker update --cpus` sets); a quota of -1 lifts it."""

    node: str
    cpu_quota: int
    cpu_period: int


@dataclasses.dataclass(frozen=True)
class ReadCpuLimits:
    """A node's CPU quota and period now. Outcome: {"cpu_quota": ..., "cpu_period": ...}."""

    node: str


@dataclasses.dataclass(frozen=True)
class KillContainer:
    """The whole node dies at once: SIGKILL to every process of its container (`docker kill`)."""

    node: str


@dataclasses.dataclass(frozen=True)
class StopContainer:
    """SIGTERM to the node's container, SIGKILL after `grace` seconds (`docker stop -t`). Outcome: the seconds
    it took."""

    node: str
    grace: float


@dataclasses.dataclass(frozen=True)
class RestartContainer:
    """The same container (same hostname) again: restarted at once, or stopped for `downtime` seconds first."""

    node: str
    grace: float
    downtime: float


@dataclasses.dataclass(frozen=True)
class StartContainer:
    node: str


@dataclasses.dataclass(frozen=True)
class PauseContainer:
    """Freeze every process of the node (the cgroup freezer: `docker pause`)."""

    node: str


@dataclasses.dataclass(frozen=True)
class Unpause:
    node: str


@dataclasses.dataclass(frozen=True)
class RequireCkptStorage:
    """Refuse (before anything is recorded) a directory that is not the cluster's own size-limited checkpoint
    storage: /ckpt or a folder in it, on a cluster started with ckpt_size."""

    directory: str


@dataclasses.dataclass(frozen=True)
class RunNodeScript:
    """Run one of the nemesis's node scripts (sim/faults/nodescripts.py, by its name in NODE_SCRIPTS) in a
    node, with `args`, then a draw of the nemesis's seeded random numbers when `seeded`, then `act` (the
    marker heal ends an interrupted one by). Outcome: what it printed (a dict). Exit 3: the request was wrong
    for this node (its stderr, and `hint`)."""

    node: str
    script: str
    what: str  # for the error: "filling the disk"
    args: tuple[Any, ...] = ()
    seeded: bool = False
    act: str | None = None
    hint: str = ""


@dataclasses.dataclass(frozen=True)
class CatchWriter:
    """Signal the first worker of a node that opens a file under `directory` for writing, the moment it does
    (within `within` seconds); `act`: the marker heal ends an interrupted watcher by. Outcome: what it caught
    (pid, file, size_at_kill)."""

    node: str
    directory: str
    within: float
    signal: signals.Signals
    act: str | None = None
    # Then freeze the whole node (`docker pause`); if that fails, the caught worker is continued.
    pause_after: bool = False


@dataclasses.dataclass(frozen=True)
class ScaleNodes:
    """Run exactly node0..node{nodes-1}: new nodes join the running job; the highest ones leave, gracefully
    (`docker stop -t grace`) or abruptly (`docker kill`). Outcome: {"joined": [...], "left": [...]}."""

    nodes: int
    abrupt: bool
    grace: float


@dataclasses.dataclass(frozen=True)
class Wait:
    """Let `seconds` pass (a node kept down)."""

    seconds: float


@dataclasses.dataclass(frozen=True)
class EndedWithNode:
    """Forget the node's faults in force that lived in its processes or network namespace (they ended with it)."""

    node: str


@dataclasses.dataclass(frozen=True)
class NetworkBack:
    """A restarted or started container has a fresh network namespace: the partitions in force are applied
    to it again, and its faults that lived in the old one are forgotten."""

    node: str


@dataclasses.dataclass(frozen=True)
class ApplyPartitions:
    """The one mechanism of every partition (as in Jepsen): the union of the partitions in force, as iptables
    rules in each running container's own namespace (its chain flushed, then filled). Outcome: each node's
    rules. A heal applies them once, at its end, whatever it undid."""


@dataclasses.dataclass(frozen=True)
class ShapeLink:
    """Degrade a node's link: random loss both ways (iptables statistic), or its root qdisc on `iface`
    replaced by a bandwidth limit (`rate_bps`, tc tbf) or by netem (`netem`: delay_ms, jitter_ms, duplicate_pct,
    corrupt_pct). Outcome: the commands run."""

    node: str
    loss_pct: float | None
    rate_bps: int | None
    netem: Mapping[str, float]
    iface: str | None


@dataclasses.dataclass(frozen=True)
class FindIface:
    """The interface that carries a node's cluster traffic (never assumed eth0: it is renamed on reconnect).
    Outcome: {"iface": its name}."""

    node: str


@dataclasses.dataclass(frozen=True)
class ClearLink:
    """Lift a node's link faults: its loss chains flushed, every interface's root qdisc deleted; `quiet`: a
    failure is no error (heal --all's sweep of what reality holds)."""

    node: str
    quiet: bool = False


@dataclasses.dataclass(frozen=True)
class HealFaults:
    """Undo one fault in force by its id, or (None) every reversible one: heal's plan (sim/faults/heal.py)
    from the faults in force and the containers' states, carried out; what it could not undo is an error that
    names them. Outcome: the ids undone."""

    fault_id: str | None


@dataclasses.dataclass(frozen=True)
class ForgetInForce:
    """Forget the node's faults in force of kind `in_force`: what this fault undid. Outcome: their ids."""

    node: str
    in_force: str


Action = (
    NodeShell
    | LimitWrites
    | Signal
    | ContinueWorker
    | Touch
    | RemoveFile
    | ExhaustMemory
    | LimitCpu
    | ReadCpuLimits
    | KillContainer
    | StopContainer
    | RestartContainer
    | StartContainer
    | PauseContainer
    | Unpause
    | Wait
    | ScaleNodes
    | RequireCkptStorage
    | RunNodeScript
    | CatchWriter
    | EndedWithNode
    | NetworkBack
    | ForgetInForce
    | ApplyPartitions
    | ShapeLink
    | FindIface
    | ClearLink
    | HealFaults
)


@dataclasses.dataclass(frozen=True)
class ChaosMesh:
    """How a kind is exported to Kubernetes (sim/export/k8s.py): one Chaos Mesh object of `kind` for the step's
    hold (or `deadline_s`), `spec` under it (the exporter adds the mode, the selector of `target` and, when
    `in_container`, the job's container), and the note that says how it differs from the local fault."""

    kind: str  # "TimeChaos"
    spec: Mapping[str, Any]
    target: str
    note: str
    in_container: bool = True
    deadline_s: float | None = None  # None: the step's hold (or the run); a one-shot's own deadline
    head: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # fields before the mode and selector


@dataclasses.dataclass(frozen=True)
class PodChaos:
    """A Chaos Mesh PodChaos `action` ("container-kill", "pod-kill", "pod-failure") on the target's pod, for
    `duration_s` (pod-failure) or once; `in_container`: of the job's container only, `container`: of that
    container; `grace`: its gracePeriod. `note`: "" when it says nothing the action does not."""

    action: str
    target: str
    note: str = ""
    in_container: bool = False
    container: str | None = None
    grace: int | None = None
    duration_s: float | None = None


@dataclasses.dataclass(frozen=True)
class PodDown:
    """A node lost: PodChaos pod-kill (its pod re-created at once, `grace` its gracePeriod), or, while a later
    step starts it again (or always for etcd), pod-failure until then."""

    target: str
    grace: int | None = None


@dataclasses.dataclass(frozen=True)
class CutFromJob:
    """A NetworkChaos partition between the target's pod and the job's (a frozen or isolated etcd)."""

    target: str
    note: str = ""


@dataclasses.dataclass(frozen=True)
class ExecTask:
    """A Workflow Task that runs one of the exporter's pod scripts (`script`, by its name in
    sim/export/k8s.py's POD_SCRIPTS) in the target's pod through `kubectl exec`, with `args`, then the
    scenario's seed when `seeded`; `rank`: the pod whose worker has that global rank."""

    script: str
    target: str
    args: tuple[Any, ...] = ()
    seeded: bool = False
    rank: int | None = None


@dataclasses.dataclass(frozen=True)
class ScaleJob:
    """A Task that runs `kubectl scale` on the job to `nodes` replicas (a fixed-size TrainJob cannot: not
    exported there)."""

    nodes: int


@dataclasses.dataclass(frozen=True)
class Held:
    """Two Tasks: `start`, a wait for the step's hold, then `end`."""

    start: ExecTask
    end: ExecTask
    note: str = ""


# What an EndsHold step ends: a fault in force its kind undoes (heal: any; unpause: a pause), or a node lost
# (start-node: a kill or stop of the same node, held down until then).
ENDS = ("in force", "lost")


@dataclasses.dataclass(frozen=True)
class EndsHold:
    """No template of its own: the step ends the fault before it (that one lasts until this step's time)."""

    ends: str = "in force"  # ENDS

    def __post_init__(self) -> None:
        if self.ends not in ENDS:
            raise ValueError(f"EndsHold: ends {self.ends!r} is not one of {ENDS}")


@dataclasses.dataclass(frozen=True)
class Partitioned:
    """A NetworkChaos partition for each pair of sides a partition's `shape` (one of its options: groups,
    isolate, from_etcd, from_peers, one_way) cuts, with `nodes` its value; the exporter selects the job's pods
    on each side (it knows the job's nodes and whether it has etcd)."""

    shape: str
    nodes: Any


@dataclasses.dataclass(frozen=True)
class LinkChaos:
    """One NetworkChaos on the target's link for each way it is degraded (`parts`: its Chaos Mesh action and
    fields), in parallel; `notes` say how they differ from the local fault."""

    target: str
    parts: tuple[tuple[str, Mapping[str, Any]], ...]
    notes: tuple[str, ...] = ()


K8sForm = ChaosMesh | PodChaos | PodDown | CutFromJob | ExecTask | Held | EndsHold | ScaleJob | Partitioned | LinkChaos


@dataclasses.dataclass(frozen=True)
class Entry:
    """Another catalog entry that asks for a kind, aimed at a fixed target: `sim etcd kill` is kill-node at
    etcd. Its options have no target."""

    name: str  # as a scenario step names it: "etcd-kill"
    verb: tuple[str, ...]  # ("etcd", "kill")
    help: str
    options: type[FaultOptions]
    target: str  # "etcd"
    undo_verb: str = ""  # a reversible kind's: the verb that undoes it by hand ("etcd unpause")
    needs_etcd: bool = True  # the cluster must have etcd


def _refusal(already: str) -> Callable[[Struck, str], str]:
    return lambda at, fault_id: f"{at.node}: {already}; `sim heal {fault_id}` first"


@dataclasses.dataclass(frozen=True)
class Act:
    """How a kind is asked for and what it does, as data and pure functions; the nemesis carries it out.

    `options`: its options (a FaultOptions dataclass; their `target` is the node it strikes). The executor
    resolves what it strikes (`strikes`, one of STRIKES) into a `Struck`. `inject(options, at)`: the actions
    that inject it there. `result(options, at, outcomes)`: its typed result, a `result_type` (`to_dict()` is the
    history's ok record) from each action's outcome. `detail(options, at)`: what `sim faults` shows while it is in
    force, `already`: why a second one on the same node is refused (detail None: its in-force record has none).
    `undo(at)`: the actions that end it (`at` from its in-force record). `k8s(options)`: its Kubernetes form,
    None where there is none."""

    verb: tuple[str, ...]  # on the CLI: ("skew-clock",) is `sim skew-clock`; (): asked for only as its entries
    help: str  # one line
    options: type[FaultOptions]
    inject: Callable[[Any, Struck], tuple[Action, ...]]
    result: Callable[[Any, Struck, tuple[Any, ...]], FaultResult]
    result_type: type[FaultResult]  # what `result` builds, and what the run model parses its ok record as
    detail: Callable[[Any, Struck], str | None]
    already: str
    undo: Callable[[Struck], tuple[Action, ...]] | None
    k8s: Callable[[Any, str], K8sForm | None]  # (options, its target: an entry's fixed one or options.target)
    example: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # options as a scenario step gives them
    allow_etcd: bool = True  # False: it acts on a node's training processes, never etcd
    # Its undo needs the node running (a stopped node's is refused with what to do first); False: a stopped
    # or removed node ended it with its container.
    undo_needs_running: bool = True
    # Its undo acts on a stopped container too (what it set stays in the container's settings).
    undo_on_stopped: bool = False
    strikes: str = "node"  # STRIKES
    # The invoke record's args (default: the options given, but the target); `seeded`: the nemesis's seed too.
    args: Callable[[Any], Mapping[str, Any]] | None = None
    seeded: bool = False
    # Its id in force, when not `{in_force}-{node}` (a held worker's names its pid), and the in-force
    # record's fields beyond its fault, target and detail (the pid or file heal needs).
    in_force_id: Callable[[Struck], str] | None = None
    in_force_fields: Callable[[Any, Struck], Mapping[str, Any]] = lambda o, at: {}
    # Actions whose outcomes (dicts) its in-force record keeps, read under the fault store's lock before it
    # acts (the CPU quota a straggler's undo restores, the interface a link's qdisc goes on); its inject sees
    # them as `at.kept`.
    remembers: Callable[[Any, Struck], tuple[Action, ...]] = lambda o, at: ()
    # Why a second one is refused (default: `{node}: {already}; sim heal ID first`); None from it: never.
    refusal: Callable[[Struck, str], str | None] | None = None
    # Why it cannot act on the node as it is (its container's state in `at.state`), before anything acts.
    problem: Callable[[Struck], str | None] | None = None
    needs_running: bool = True  # False: it brings a stopped container back
    # Its undo acts only while its node is paused (a pause): the node runs again after it.
    undo_while_paused: bool = False
    entries: tuple[Entry, ...] = ()  # other catalog entries that ask for it (etcd-kill: kill-node at etcd)
    # The target its history records when its options name none (a scale: "nodes=N").
    target_of: Callable[[Any], str] | None = None
    # Checks carried out before anything is recorded (a filler goes only on the cluster's checkpoint storage).
    requires: Callable[[Any], tuple[Action, ...]] = lambda o: ()
    # Its in-force record once it acted, from its outcomes (the filler's size), replacing its intent's.
    in_force_after: Callable[[Any, Struck, tuple[Any, ...]], Mapping[str, Any]] | None = None
    # Its undo may run in any running node (a file on the cluster's shared checkpoint volume).
    undo_anywhere: Callable[[Struck], bool] = lambda at: False
    # Its catalog entry's name (a scenario step's) when not its kind's: `netem` asks for the kind link.
    name: str | None = None
    # strikes "links": the partition its options (or an entry's fixed target) cut among the cluster's nodes
    # (and etcd, when it has one: the bool); a bad shape is refused before anything is recorded.
    links: Callable[[Any, str | None, tuple[str, ...], bool], Partition] | None = None
    # A failed inject is undone once its intent is forgotten (a partition's rules half-applied: the partitions
    # left in force applied again).
    undo_on_failure: bool = False

    def __post_init__(self) -> None:
        if not issubclass(self.result_type, FaultResult):
            raise ValueError(f"act {self.verb}: its result_type is a FaultResult (sim.core.history)")
        if self.strikes not in STRIKES:
            raise ValueError(f"act {self.verb}: strikes {self.strikes!r} is not one of {STRIKES}")
        if (self.strikes == "links") != (self.links is not None):
            raise ValueError(f"act {self.verb}: the links it cuts exactly when it strikes links")

    def recorded_target(self, options: Any, target: str | None = None) -> str:
        """The target its history records (`target`: an entry's fixed one): a worker struck by global rank is
        `rank:N`, wherever it runs."""
        if self.target_of is not None:
            return self.target_of(options)
        rank = getattr(options, "rank", None) if self.strikes == "worker" else None
        return (target or options.target) if rank is None else f"rank:{rank}"

    def recorded_args(self, options: Any) -> dict[str, Any]:
        if self.args is not None:
            return dict(self.args(options))
        return {name: value for name, value in options.given().items() if name != "target"}

    def refused(self, at: Struck, fault_id: str) -> str | None:
        return (self.refusal or _refusal(self.already))(at, fault_id)


@dataclasses.dataclass(frozen=True)
class FaultKind:
    """One kind of fault, as the history names it, with what the verdict layer and `sim vet` need to know of it.

    `undo_op`: the operation the history records for its undo (one of UNDO_OPS), None when nothing undoes it
    (a kill is over once it happened). `in_force`: the kind under which the fault store lists it while it is in
    force (`sim faults`, `sim heal ID`), None for a fault that is over at once. Its id there is
    `{in_force}-{node}` for a fault of one node; a partition's is drawn at random (its act's in_force_id).
    """

    name: str
    undo_op: str | None = None
    in_force: str | None = None
    # The in-force names its records had before (a running cluster's faults, written by an older sim): read as
    # `in_force`, their ids (`{old}-{node}`) kept, so they are still listed, refused twice and healed.
    in_force_was: tuple[str, ...] = ()
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
    # It names the fault it undoes by its id in force (`heal ID`), not by its node (`unpause NODE`).
    undoes_by_id: bool = False
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
    # How it is asked for and what it does (options, inject, undo, result, Chaos Mesh form); every kind declares
    # one (tests/unit/test_faultkinds.py), None only for UNKNOWN (a record of a kind this version does not know).
    act: Act | None = None

    def __post_init__(self) -> None:
        if self.undo_op is not None and self.undo_op not in UNDO_OPS:
            raise ValueError(f"fault kind {self.name}: undo_op {self.undo_op!r} is not one of {UNDO_OPS}")
        if self.undo_op is not None and self.in_force is None:
            raise ValueError(f"fault kind {self.name}: reversible, so it needs its in-force kind")
        if self.in_force_was and self.in_force is None:
            raise ValueError(f"fault kind {self.name}: in_force_was names what its in-force records were called")
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

    def read_result(self, result: FaultResult | Mapping | None) -> FaultResult:
        """A fault's ok record's result, typed as this kind's (the common FaultResult for a kind this version
        does not know): a field it lacks, or of another type, reads None."""
        data = result.to_dict() if isinstance(result, FaultResult) else result
        return (FaultResult if self.act is None else self.act.result_type).parse(data)

    @property
    def reversible(self) -> bool:
        return self.undo_op is not None

    def in_force_id(self, node: str) -> str | None:
        """The id `sim faults` and `sim heal` use for this fault on one node (a held or stalled worker's
        adds its pid: the nemesis's result holds it)."""
        return None if self.in_force is None else f"{self.in_force}-{node}"

    def in_force_ids_was(self, node: str) -> tuple[str, ...]:
        """The ids an older sim gave this fault on one node (in_force_was): one of them in force is this fault."""
        return tuple(f"{old}-{node}" for old in self.in_force_was)

    def in_force_id_of(self, at: Struck) -> str | None:
        """Its id in force once the executor resolved what it strikes."""
        if self.in_force is not None and self.act is not None and self.act.in_force_id is not None:
            return self.act.in_force_id(at)
        return self.in_force_id(at.node)
