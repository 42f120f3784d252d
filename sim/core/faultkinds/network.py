"""Network faults, all of them: links cut between nodes (partition, and etcd-isolate: its entry aimed at etcd), a
node's link degraded (link, asked for as `netem`), and heal, which undoes any reversible fault. Options, inject
and undo as actions, typed results, in-force records, Kubernetes forms.

Partitions are data (sim.core.partition) applied by one mechanism, ApplyPartitions (as in Jepsen): a partition's
inject and its undo both apply the union of those in force, so healing one keeps the others.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping, Sequence

from sim.core.errors import UsageError
from sim.core.faultoptions import (
    FLAG,
    GROUPS,
    NODES,
    NODES_PAIR,
    PERCENT,
    RATE,
    SECONDS,
    TARGET,
    TEXT,
    FaultOptions,
    exactly_one,
    option,
)
from sim.core.history import FaultResult
from sim.core.parse import check_node_names, go_duration
from sim.core.partition import Partition, cut_from, isolate, one_way, split

from .base import (
    Act,
    ApplyPartitions,
    ClearLink,
    CutFromJob,
    EndsHold,
    Entry,
    FaultKind,
    FindIface,
    HealFaults,
    LinkChaos,
    NoOptions,
    Partitioned,
    Provocation,
    ShapeLink,
    Struck,
)

ETCD = "etcd"  # the etcd container's node name (sim.faults.targets.ETCD)
_TARGET_HELP = "a node (node0, ...), or random (seeded), store-host, rank0, etcd"
# Chaos Mesh's NetworkChaos action that cuts links (what a partition and a frozen or isolated etcd export as).
CHAOS_PARTITION = "partition"


# ---------------------------------------------------------------- options

PARTITION_SHAPES = ("groups", "isolate", "from_etcd", "from_peers", "one_way")


@dataclasses.dataclass(frozen=True)
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

    def cuts(self, nodes: Sequence[str], *, has_etcd: bool) -> Partition:
        """The links cut among `nodes` (and etcd, when the cluster has it)."""
        ((shape, value),) = self.given().items()
        everyone = [*nodes, ETCD] if has_etcd else list(nodes)
        if shape == "groups":
            return split(value, nodes)
        if shape == "one_way":
            src, dst = (
                check_node_names(side, everyone, f"one_way {label}")
                for side, label in zip(value, ("from", "to"), strict=True)
            )
            return one_way(src, dst)
        chosen = check_node_names(value, nodes, shape)
        if shape == "isolate":
            return isolate(chosen, everyone)
        if shape == "from_etcd":
            if not has_etcd:
                raise UsageError("from_etcd: this cluster has no etcd (c10d/static backend); use from_peers or isolate")
            return cut_from(chosen, [ETCD], everyone)
        return cut_from(chosen, [n for n in nodes if n not in chosen], everyone)


@dataclasses.dataclass(frozen=True)
class HealOptions(FaultOptions):
    id: str | None = option(TEXT, "a fault id (see `sim faults`)", positional=True, metavar="fault_id")
    all: bool = option(FLAG, "every reversible fault in force", False)

    def problem(self) -> str | None:
        return exactly_one(self, ("id", "all"))


_NETEM_QDISC = ("delay", "jitter", "duplicate", "corrupt")


@dataclasses.dataclass(frozen=True)
class NetemOptions(FaultOptions):
    target: str = option(TARGET, _TARGET_HELP, required=True, positional=True)
    loss: float | None = option(PERCENT, "random packet loss, e.g. 30% (iptables statistic)")
    rate: int | None = option(RATE, "bandwidth, e.g. 1mbit (tc tbf)")
    delay: float | None = option(SECONDS, "e.g. 100ms (needs netem)")
    jitter: float | None = option(SECONDS, "e.g. 20ms, with a delay (needs netem)")
    duplicate: float | None = option(PERCENT, "e.g. 1% (needs netem)")
    corrupt: float | None = option(PERCENT, "e.g. 1% (needs netem)")

    def problem(self) -> str | None:
        # Checked before anything acts.
        given = self.given().keys()
        if not {"loss", "rate", *_NETEM_QDISC} & given:
            return "nothing to degrade; give loss, rate, or delay/jitter/duplicate/corrupt"
        if "rate" in given and set(_NETEM_QDISC) & given:
            return "rate and delay/jitter/duplicate/corrupt both replace the root qdisc; use one"
        if "jitter" in given and "delay" not in given:
            return "jitter varies a delay; add one, e.g. delay: 100ms"
        return None

    def netem(self) -> dict[str, float]:
        """Its netem qdisc's settings, those given (what the history's args and the in-force record hold)."""
        settings = {
            "delay_ms": _ms(self.delay),
            "jitter_ms": _ms(self.jitter),
            "duplicate_pct": self.duplicate,
            "corrupt_pct": self.corrupt,
        }
        return {name: value for name, value in settings.items() if value is not None}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


# ---------------------------------------------------------------- results (the history's ok records)


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class PartitionResult(FaultResult):
    """What a partition did: its id, its description, each link cut ([src, dst]) and each running node's
    iptables rules as applied (every partition in force)."""

    partition: str | None = None  # its description
    cuts: tuple[tuple[str, ...], ...] | None = None  # each cut, the nodes on one side
    rules: Mapping[str, tuple[str, ...]] | None = None  # each node's iptables rules, as applied

    @classmethod
    def _derived(cls, data: Mapping) -> dict:
        cuts, derived = data.get("cuts"), {}
        if isinstance(cuts, list) and all(isinstance(c, list) for c in cuts):
            derived["cuts"] = tuple(tuple(str(n) for n in c) for c in cuts)
        if "rules" in data:  # a malformed value reads as None (as_written keeps it), never half-typed
            rules = data["rules"]
            valid = isinstance(rules, dict) and all(isinstance(r, list) for r in rules.values())
            derived["rules"] = (
                {str(n): tuple(str(r) for r in node_rules) for n, node_rules in rules.items()} if valid else None
            )
        return derived


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class LinkResult(FaultResult):
    commands: tuple[str, ...] | None = None  # as run in the node's network namespace


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class HealResult(FaultResult):
    healed: tuple[str, ...] | None = None  # the ids undone


# ---------------------------------------------------------------- partition (and etcd-isolate)


def _links(o: PartitionOptions | NoOptions, target: str | None, nodes: tuple[str, ...], has_etcd: bool) -> Partition:
    if target == ETCD:  # etcd-isolate: etcd cut off from every node
        return cut_from([ETCD], nodes, [*nodes, ETCD])
    return o.cuts(nodes, has_etcd=has_etcd)


def _k8s_partition(o: PartitionOptions | NoOptions, target: str | None) -> CutFromJob | Partitioned:
    if target == ETCD:
        return CutFromJob(ETCD)
    ((shape, value),) = o.given().items()
    return Partitioned(shape, value)


def _cuts(at: Struck) -> list[list[str]]:
    return sorted(map(list, at.cuts))


PARTITION = FaultKind(
    "partition",
    undo_op="heal",
    in_force="partition",
    loses_node=True,
    cuts_links=True,
    lane="partitioned",
    provocations={
        "partition": Provocation(
            "one node partitioned (<=20 s)",
            "partition",
            90,
            {"isolate": ("{victim}",)},
            duration_s=20.0,
            undone_once_regrouped=True,
            survival="the others time out and regroup; the node rejoins once healed",
            hosted_on=("etcd-v2", "etcd-v3"),
            cost_s=36.0,
        ),
    },
    act=Act(
        verb=("partition",),
        help="cut the network: groups 'node0,node1|node2,node3', or --isolate/--from-etcd/--from-peers/--one-way",
        options=PartitionOptions,
        strikes="links",
        links=_links,
        inject=lambda o, at: (ApplyPartitions(),),  # its intent is in force: applied with the others
        result_type=PartitionResult,
        result=lambda o, at, outcomes: PartitionResult(id=at.id, partition=at.node, cuts=_cuts(at), rules=outcomes[0]),
        detail=lambda o, at: None,  # its target is its description
        already="",
        undo=lambda at: (ApplyPartitions(),),  # once it is forgotten: the others applied again
        undo_on_failure=True,
        k8s=_k8s_partition,
        example={"isolate": ("node1",)},
        args=lambda o: {},
        in_force_id=lambda at: f"partition-{uuid.uuid4().hex[:6]}",
        in_force_fields=lambda o, at: {"cuts": _cuts(at)},
        refusal=lambda at, fault_id: None,  # partitions add up: each is one more in force
        undo_needs_running=False,
        entries=(Entry("etcd-isolate", ("etcd", "isolate"), "cut etcd off from every node", NoOptions, ETCD),),
    ),
)


# ---------------------------------------------------------------- link (netem)


def _k8s_link(o: NetemOptions, target: str) -> LinkChaos:
    parts: list[tuple[str, dict]] = []
    notes: list[str] = []
    if o.loss is not None:
        parts.append(("loss", {"loss": {"loss": f"{o.loss:g}", "correlation": "0"}}))
    if o.rate is not None:
        rate = f"{max(1, o.rate // 1000)}kbps"
        parts.append(("bandwidth", {"bandwidth": {"rate": rate, "limit": 20971520, "buffer": 10000}}))
        notes.append(f"rate as NetworkChaos bandwidth {rate} (limit and buffer are Chaos Mesh's own).")
    if o.delay is not None:
        delay = {"latency": go_duration(o.delay), "correlation": "0"}
        if o.jitter is not None:
            delay["jitter"] = go_duration(o.jitter)
        parts.append(("delay", {"delay": delay}))
    if o.duplicate is not None:
        parts.append(("duplicate", {"duplicate": {"duplicate": f"{o.duplicate:g}", "correlation": "0"}}))
    if o.corrupt is not None:
        parts.append(("corrupt", {"corrupt": {"corrupt": f"{o.corrupt:g}", "correlation": "0"}}))
    if o.delay is not None and len(parts) > 1:
        notes.append("several link faults at once are one NetworkChaos each, in parallel.")
    return LinkChaos(target, tuple(parts), tuple(notes))


LINK = FaultKind(
    "link",
    undo_op="heal",
    in_force="link",
    degrading=True,
    lives_in_node=True,
    provocations={
        "netem": Provocation(
            "lossy link (10% loss, 10 s)",
            "netem",
            100,
            {"target": "{victim}", "loss": 10.0},
            duration_s=10.0,
            survival="training slows but carries on: no restart is needed, steps go on",
            cost_s=12.0,
        ),
    },
    act=Act(
        name="netem",
        verb=("netem",),
        help="degrade a node's link: --loss, --rate, or --delay/--jitter/--duplicate/--corrupt (kernel netem)",
        options=NetemOptions,
        # A qdisc goes on the interface that carries cluster traffic, looked up before it acts.
        remembers=lambda o, at: (FindIface(at.node),) if o.rate is not None or o.netem() else (),
        inject=lambda o, at: (ShapeLink(at.node, o.loss, o.rate, o.netem(), at.kept.get("iface")),),
        result_type=LinkResult,
        result=lambda o, at, outcomes: LinkResult(id=f"link-{at.node}", node=at.node, commands=tuple(outcomes[0])),
        detail=lambda o, at: None,  # its record holds its settings
        already="",
        undo=lambda at: (ClearLink(at.node),),
        k8s=_k8s_link,
        example={"target": "node1", "loss": 10.0},
        args=lambda o: {"loss_pct": o.loss, "rate_bps": o.rate, "netem": o.netem()},
        in_force_fields=lambda o, at: {"loss_pct": o.loss, "rate_bps": o.rate, "netem": o.netem()},
        refusal=lambda at, fault_id: None,  # a new one replaces the node's link fault
        undo_needs_running=False,  # a node stopped since took its qdisc and chains along
    ),
)


# ---------------------------------------------------------------- heal

HEAL = FaultKind(
    "heal",
    undoes=True,
    undoes_by_id=True,
    act=Act(
        verb=("heal",),
        help="undo one fault by id (see `sim faults`), or every reversible one with --all",
        options=HealOptions,
        strikes="cluster",
        target_of=lambda o: o.id or "all",
        inject=lambda o, at: (HealFaults(o.id),),
        result_type=HealResult,
        result=lambda o, at, outcomes: HealResult(healed=tuple(outcomes[0])),
        detail=lambda o, at: "healed",
        already="",
        undo=None,
        k8s=lambda o, target: EndsHold(),
        example={"all": True},
        args=lambda o: {},
    ),
)

KINDS = (PARTITION, HEAL, LINK)
