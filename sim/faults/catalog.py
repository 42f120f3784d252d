"""The fault catalog: every kind of fault, once.

An entry names the fault as a scenario step does, and carries its options (a frozen dataclass
that validates itself; each field declares how it is read and what it holds), its CLI verb, how
to invoke it on a Nemesis and, for a reversible fault, how to undo it. The scenario parser
(sim.scenarios.scenario), the runner's dispatch (sim.scenarios.runner) and the CLI verbs (sim.cli.faults) are all
generated from FAULTS. A kind that declares its act (sim/core/faultkinds) gets its entries generated (`_acting`,
`_aimed`), so a new kind is its module only; the network family's are still written out here.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sim.core.errors import FaultError, UsageError
from sim.core.faultkinds import FAULT_KINDS, KINDS, PROVOCATIONS, FaultKind, checkpoint, container, disk, etcd, process
from sim.core.faultkinds.container import NoOptions
from sim.core.faultoptions import (
    FLAG,
    PERCENT,
    RATE,
    SECONDS,
    TARGET,
    TEXT,
    FaultOptions,
    OptionKind,
    exactly_one,
    is_names,
    option,
)
from sim.core.history import FaultResult
from sim.core.parse import check_node_names
from sim.faults import partition as partitions
from sim.faults.targets import ETCD

if TYPE_CHECKING:
    from sim.faults.nemesis import Nemesis


# ---------------------------------------------------------------- options only these faults take


def _comma_names(text: str) -> tuple[str, ...]:
    """Node names as typed on the command line: "node0,node2"."""
    return tuple(name.strip() for name in text.split(","))


NODES = OptionKind("nodes", _comma_names, is_names, "a list of node names")


GROUPS = OptionKind(
    "groups",
    partitions.parse_groups,
    lambda v: isinstance(v, (tuple, list)) and all(map(is_names, v)),
    "groups of node names",
)


NODES_PAIR = OptionKind(
    "nodes pair",
    lambda sides: tuple(map(_comma_names, sides)),
    lambda v: isinstance(v, (tuple, list)) and len(v) == 2 and all(map(is_names, v)),
    "[from, to], two lists of node names",
    nargs=2,
)


# ---------------------------------------------------------------- each fault's options

_TARGET_HELP = "a node (node0, ...), or random (seeded), store-host, rank0, etcd"
_DOWNTIME_HELP = "stay down this long before starting again"
_NODE_TARGET_HELP = "a node (node0, ...), or random (seeded), store-host, rank0"


PARTITION_SHAPES = ("groups", "isolate", "from_etcd", "from_peers", "one_way")


@dataclass(frozen=True)
class PartitionOptions(FaultOptions):
    groups: tuple[tuple[str, ...], ...] | None = option(
        GROUPS, "groups separated by |, every node in exactly one, e.g. node0,node1|node2,node3", positional=True
    )
    isolate: tuple[str, ...] | None = option(NODES, "nodes cut off from everyone (etcd included)")
    from_etcd: tuple[str, ...] | None = option(NODES, "nodes cut off from etcd only (control plane)")
    from_peers: tuple[str, ...] | None = option(NODES, "nodes cut off from the other nodes only (data plane)")
    one_way: tuple[tuple[str, ...], tuple[str, ...]] | None = option(
        NODES_PAIR, "FROM's packets to TO are dropped; TO->FROM still flows", metavar=("FROM", "TO")
    )

    def problem(self) -> str | None:
        return exactly_one(self, PARTITION_SHAPES)

    def cuts(self, nodes: Sequence[str], *, has_etcd: bool) -> partitions.Partition:
        """The links cut among `nodes` (and etcd, when the cluster has it)."""
        ((shape, value),) = self.given().items()
        everyone = [*nodes, ETCD] if has_etcd else list(nodes)
        if shape == "groups":
            return partitions.split(value, nodes)
        if shape == "one_way":
            src, dst = (
                check_node_names(side, everyone, f"one_way {label}")
                for side, label in zip(value, ("from", "to"), strict=True)
            )
            return partitions.one_way(src, dst)
        chosen = check_node_names(value, nodes, shape)
        if shape == "isolate":
            return partitions.isolate(chosen, everyone)
        if shape == "from_etcd":
            if not has_etcd:
                raise UsageError("from_etcd: this cluster has no etcd (c10d/static backend); use from_peers or isolate")
            return partitions.cut_from(chosen, [ETCD], everyone)
        return partitions.cut_from(chosen, [n for n in nodes if n not in chosen], everyone)


@dataclass(frozen=True)
class HealOptions(FaultOptions):
    id: str | None = option(TEXT, "a fault id (see `sim faults`)", positional=True, metavar="fault_id")
    all: bool = option(FLAG, "every reversible fault in force", False)

    def problem(self) -> str | None:
        return exactly_one(self, ("id", "all"))


_NETEM_QDISC = ("delay", "jitter", "duplicate", "corrupt")


@dataclass(frozen=True)
class NetemOptions(FaultOptions):
    target: str = option(TARGET, _TARGET_HELP, required=True, positional=True)
    loss: float | None = option(PERCENT, "random packet loss, e.g. 30% (iptables statistic)")
    rate: int | None = option(RATE, "bandwidth, e.g. 1mbit (tc tbf)")
    delay: float | None = option(SECONDS, "e.g. 100ms (needs netem)")
    jitter: float | None = option(SECONDS, "e.g. 20ms, with a delay (needs netem)")
    duplicate: float | None = option(PERCENT, "e.g. 1% (needs netem)")
    corrupt: float | None = option(PERCENT, "e.g. 1% (needs netem)")

    def problem(self) -> str | None:
        # Nemesis.link's own rules, checked before anything acts.
        given = self.given().keys()
        if not {"loss", "rate", *_NETEM_QDISC} & given:
            return "nothing to degrade; give loss, rate, or delay/jitter/duplicate/corrupt"
        if "rate" in given and set(_NETEM_QDISC) & given:
            return "rate and delay/jitter/duplicate/corrupt both replace the root qdisc; use one"
        if "jitter" in given and "delay" not in given:
            return "jitter varies a delay; add one, e.g. delay: 100ms"
        return None


# ---------------------------------------------------------------- the catalog


@dataclass(frozen=True)
class FaultEntry:
    """One entry of the fault catalog: how a person or a scenario asks for a kind of fault (what the kind
    is, its traits and undo, is its sim.core.faultkinds.FaultKind). `invoke(nemesis, options)` injects it
    and returns the nemesis' result; `undo(nemesis, result)` reverses it (reversible faults only)."""

    name: str  # as a scenario step names it
    options: type[FaultOptions]
    verb: tuple[str, ...]  # on the CLI: ("kill",) is `sim kill`, ("etcd", "kill") is `sim etcd kill`
    help: str  # one line
    invoke: Callable[[Nemesis, Any], dict]
    undo: Callable[[Nemesis, dict], dict] | None = None
    undo_verb: str = ""  # reversible: the CLI verb that undoes it by hand, e.g. "heal"
    needs_etcd: bool = False
    needs_running: bool = True  # False: it brings a stopped container back
    # Builds what it would act on among a cluster's nodes without acting, so a bad shape fails early.
    check_nodes: Callable[[Any, Sequence[str], bool], object] | None = None
    # The kind of fault it is, as the history records it (sim.core.faultkinds), when not its own name:
    # etcd-kill is kill-node aimed at etcd, netem the kind link.
    records: str = ""
    fixed_target: str | None = None  # an entry aimed at one target whatever its options (etcd-kill: etcd)

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z]+(-[a-z]+)*", self.name):
            raise ValueError(f"fault name {self.name!r}: use lowercase words joined by '-', e.g. kill-node")
        if not self.verb or not issubclass(self.options, FaultOptions):
            raise ValueError(f"fault {self.name}: needs a CLI verb and FaultOptions")
        if bool(self.undo) != bool(self.undo_verb):
            raise ValueError(f"fault {self.name}: a reversible fault names the verb that undoes it by hand")

    @property
    def reversible(self) -> bool:
        return self.undo is not None

    @property
    def kind(self) -> FaultKind:
        """What it is, read by the verdict layer from the history: its traits and its undo."""
        return KINDS[self.records or self.name]

    def end_hold(self, nemesis: Nemesis, result: dict) -> dict:
        """Undo the fault `result` came from when its hold (`--for`, a step's `for`) ends; nothing to undo when
        it is no longer in force: healed by hand, or ended with its node (killed, restarted, scaled away)."""
        fault_id = FaultResult.parse(result).id
        if fault_id is not None and all(f.id != fault_id for f in nemesis.active()):
            return {"id": fault_id, "ended": "no longer in force"}
        return self.undo(nemesis, result)

    @property
    def fields(self) -> tuple[dataclasses.Field, ...]:
        return dataclasses.fields(self.options)

    @property
    def option_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    @property
    def required(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields if f.default is dataclasses.MISSING)

    def make_options(self, given: Mapping[str, Any]) -> FaultOptions:
        """Its options from those given (by name), defaults for the rest; errors name the fault."""
        unknown = sorted(set(given) - set(self.option_names))
        if unknown:
            raise UsageError(
                f"{self.name}: takes no {', '.join(unknown)}; its options: {', '.join(self.option_names) or 'none'}"
            )
        missing = [name for name in self.required if name not in given]
        if missing:
            raise UsageError(f"{self.name}: needs {', '.join(missing)}")
        try:
            return self.options(**given)
        except UsageError as error:
            raise UsageError(f"{self.name}: {error}") from None


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def _node_names(nemesis: Nemesis) -> list[str]:
    return [c.node for c in nemesis.cluster.nodes()]


def _partition(nemesis: Nemesis, options: PartitionOptions) -> dict:
    has_etcd = any(c.node == ETCD for c in nemesis.cluster.containers())
    return nemesis.partition(options.cuts(_node_names(nemesis), has_etcd=has_etcd))


def _isolate_etcd(nemesis: Nemesis, options: NoOptions) -> dict:
    nodes = _node_names(nemesis)
    return nemesis.partition(partitions.cut_from([ETCD], nodes, [*nodes, ETCD]))


def _heal_result(nemesis: Nemesis, result: dict) -> dict:
    fault_id = FaultResult.parse(result).id
    if fault_id is None:  # never heal(None): that heals every fault in force
        raise FaultError(f"{result}: no fault id to heal; `sim faults` lists those in force")
    return nemesis.heal(fault_id)


def _undo_of(kind: FaultKind, target: str | None = None) -> Callable[[Nemesis, dict], dict] | None:
    """How the runner ends a reversible kind's hold: heal its id, or carry out its undo kind on its node (an
    entry's fixed `target`)."""
    if not kind.reversible:
        return None
    if kind.undo_op == "heal":
        return _heal_result
    undo = KINDS[kind.undo_op]
    return lambda n, result: n.carry_out(undo, undo.act.options(target=target or FaultResult.parse(result).node))


def _acting(kind: FaultKind) -> FaultEntry:
    """The catalog entry of a kind that declares its own act (sim/core/faultkinds): the nemesis carries it out."""
    act = kind.act
    return FaultEntry(
        kind.name,
        act.options,
        act.verb,
        act.help,
        lambda n, o: n.carry_out(kind, o),
        undo=_undo_of(kind),
        undo_verb=kind.undo_op or "",
        needs_running=act.needs_running,
    )


def _aimed(kind: FaultKind, name: str) -> FaultEntry:
    """Another entry of a kind that declares its own act, aimed at its fixed target (etcd-kill: kill-node at etcd)."""
    (entry,) = (e for e in kind.act.entries if e.name == name)
    return FaultEntry(
        entry.name,
        entry.options,
        entry.verb,
        entry.help,
        lambda n, o: n.carry_out(kind, o, target=entry.target),
        undo=_undo_of(kind, entry.target),
        undo_verb=entry.undo_verb or kind.undo_op or "",
        needs_etcd=entry.needs_etcd,
        needs_running=kind.act.needs_running,
        records=kind.name,
        fixed_target=entry.target,
    )


_CATALOG = (
    _acting(process.KILL_WORKER),
    _acting(process.KILL_AGENT),
    _acting(container.KILL_NODE),
    _acting(container.STOP_NODE),
    _acting(container.RESTART_NODE),
    _acting(container.START_NODE),
    _acting(container.PAUSE),
    _acting(container.UNPAUSE),
    FaultEntry(
        "partition",
        PartitionOptions,
        ("partition",),
        "cut the network: groups 'node0,node1|node2,node3', or --isolate/--from-etcd/--from-peers/--one-way",
        _partition,
        undo=_heal_result,
        undo_verb="heal",
        check_nodes=lambda o, nodes, has_etcd: o.cuts(nodes, has_etcd=has_etcd),
    ),
    FaultEntry(
        "heal",
        HealOptions,
        ("heal",),
        "undo one fault by id (see `sim faults`), or every reversible one with --all",
        lambda n, o: n.heal(None if o.all else o.id),
    ),
    FaultEntry(
        "netem",
        NetemOptions,
        ("netem",),
        "degrade a node's link: --loss, --rate, or --delay/--jitter/--duplicate/--corrupt (kernel netem)",
        lambda n, o: n.link(
            o.target,
            loss_pct=o.loss,
            rate_bps=o.rate,
            netem={
                "delay_ms": _ms(o.delay),
                "jitter_ms": _ms(o.jitter),
                "duplicate_pct": o.duplicate,
                "corrupt_pct": o.corrupt,
            },
        ),
        undo=_heal_result,
        undo_verb="heal",
        records="link",
    ),
    _aimed(container.KILL_NODE, "etcd-kill"),
    _aimed(container.START_NODE, "etcd-start"),
    _aimed(container.RESTART_NODE, "etcd-restart"),
    _aimed(etcd.WIPE_ETCD, "etcd-wipe"),
    _aimed(container.PAUSE, "etcd-pause"),
    _aimed(container.UNPAUSE, "etcd-unpause"),
    FaultEntry(
        "etcd-isolate",
        NoOptions,
        ("etcd", "isolate"),
        "cut etcd off from every node",
        _isolate_etcd,
        undo=_heal_result,
        undo_verb="heal",
        needs_etcd=True,
        records="partition",
    ),
    _acting(process.HANG_WORKER),
    _acting(process.HANG_COLLECTIVES),
    _acting(process.RESUME_WORKER),
    _acting(container.SLOW_NODE),
    _acting(process.OOM_WORKER),
    _acting(checkpoint.CORRUPT_CHECKPOINT),
    _acting(disk.FILL_DISK),
    _acting(checkpoint.KILL_DURING_CHECKPOINT),
    _acting(checkpoint.FREEZE_DURING_CHECKPOINT),
    _acting(container.SCALE),
)


# The converted kinds the catalog does not place (a new kind goes last).
_PLACED = {entry.name for entry in _CATALOG}
FAULTS: dict[str, FaultEntry] = {
    fault.name: fault
    for fault in (
        *_CATALOG,
        *(_acting(k) for k in FAULT_KINDS if k.act is not None and k.act.verb and k.name not in _PLACED),
        *(_aimed(k, e.name) for k in FAULT_KINDS if k.act is not None for e in k.act.entries if e.name not in _PLACED),
    )
}


# ---------------------------------------------------------------- what `sim vet` does with each kind

# Each kind's provocations (sim.core.faultkinds), by the name `sim vet --faults` takes, name catalog entries.
for _name, _provocation in PROVOCATIONS.items():
    if _provocation.fault not in FAULTS:
        raise ValueError(f"provocation {_name!r}: no fault {_provocation.fault!r} in the catalog")
