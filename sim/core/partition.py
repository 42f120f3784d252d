"""Network partitions as data.

A Partition is the set of directed links that are cut: (src, dst) means packets from src never
reach dst; a symmetric cut holds both directions. Pure functions build the usual shapes (after
Jepsen's nemesis: isolate, split, one way, ...), `|` combines them, and one applier enforces any
of them the same way, from `blocked_peers` of each node.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sim.core.errors import UsageError
from sim.core.nodes import node_order
from sim.core.parse import check_node_names

Cut = tuple[str, str]


@dataclass(frozen=True)
class Partition:
    """Directed cuts between named nodes. The empty partition is a healed network."""

    cuts: frozenset[Cut] = frozenset()

    def __post_init__(self) -> None:
        cuts = frozenset(self.cuts)  # accept any iterable of pairs
        for cut in cuts:
            if not (isinstance(cut, tuple) and len(cut) == 2 and all(isinstance(n, str) and n for n in cut)):
                raise UsageError(f"cut {cut!r}: not a (src, dst) pair of node names; use e.g. ('node0', 'etcd')")
            if cut[0] == cut[1]:
                raise UsageError(f"cut {cut!r}: a node cannot be cut from itself; name two different nodes")
        object.__setattr__(self, "cuts", cuts)

    def __or__(self, other: Partition) -> Partition:
        if not isinstance(other, Partition):
            return NotImplemented
        return Partition(self.cuts | other.cuts)

    def describe(self) -> str:
        """Short human form: "node0,node1 | node2,node3" for groups cut from each other both
        ways, "node2 -/-> etcd" for a one-way cut, parts joined by "; "."""
        if not self.cuts:
            return "no cuts"
        both_ways = {cut for cut in self.cuts if cut[::-1] in self.cuts}
        parts = [_describe_both_ways(both_ways)] if both_ways else []
        return "; ".join(parts + _describe_one_way(self.cuts - both_ways))


def blocked_peers(partition: Partition, node: str) -> tuple[frozenset[str], frozenset[str]]:
    """What `node` drops to enforce `partition`: (packets arriving from these, packets going to these).

    Each cut is enforced at both of its ends, so it holds even where only one end can run
    iptables (e.g. the etcd container)."""
    drop_in_from = frozenset(src for src, dst in partition.cuts if dst == node)
    drop_out_to = frozenset(dst for src, dst in partition.cuts if src == node)
    return drop_in_from, drop_out_to


def isolate(nodes: Iterable[str], everyone: Sequence[str]) -> Partition:
    """Cut `nodes` from all other nodes, both ways. The isolated nodes still reach each other;
    to isolate each one alone, combine: isolate([a], everyone) | isolate([b], everyone)."""
    nodes = list(nodes)
    source = f"isolate {','.join(nodes)!r}"
    chosen = check_node_names(nodes, everyone, source)
    rest = [n for n in everyone if n not in chosen]
    if not rest:
        raise UsageError(f"{source}: that is every node, so nothing is cut; leave at least one node out")
    return Partition(_both_ways(chosen, rest))


def split(groups: Sequence[Sequence[str]], everyone: Sequence[str]) -> Partition:
    """Cut every group from every other, both ways; nodes within a group still reach each other.
    Every node must be in exactly one group, so nothing is left to guess."""
    if isinstance(groups, str) or any(isinstance(g, str) for g in groups):
        raise TypeError(f"split: pass groups as lists of node names, not {groups!r}")
    return _split(groups, everyone, f"partition {' | '.join(','.join(g) for g in groups)!r}")


def cut_from(nodes: Iterable[str], targets: Iterable[str], everyone: Sequence[str]) -> Partition:
    """Cut `nodes` from `targets` only, both ways: e.g. targets=["etcd"] cuts nodes from etcd but
    not from their peers; targets = the other nodes cuts them from peers but not from etcd."""
    nodes, targets = list(nodes), list(targets)
    source = f"cut {','.join(nodes)!r} from {','.join(targets)!r}"
    chosen = check_node_names(nodes, everyone, source)
    targets = check_node_names(targets, everyone, source)
    _check_disjoint(chosen, targets, source)
    return Partition(_both_ways(chosen, targets))


def one_way(src_nodes: Iterable[str], dst_nodes: Iterable[str]) -> Partition:
    """`src_nodes` cannot send to `dst_nodes`; the other direction still works. A TCP connection
    across it still stalls both ways, since acknowledgements cannot come back."""
    src_nodes, dst_nodes = list(src_nodes), list(dst_nodes)
    source = f"one-way cut {','.join(src_nodes)!r} -/-> {','.join(dst_nodes)!r}"
    srcs = check_node_names(src_nodes, None, source)
    dsts = check_node_names(dst_nodes, None, source)
    _check_disjoint(srcs, dsts, source)
    return Partition(frozenset((s, d) for s in srcs for d in dsts))


def parse_groups(text: str) -> tuple[tuple[str, ...], ...]:
    """Groups as typed: separated by "|", nodes by ","; "node0,node1|node2" -> (("node0", "node1"), ("node2",))."""
    if not text.strip():
        raise UsageError(f"partition {text!r}: empty; name groups separated by |, e.g. node0,node1|node2,node3")
    return tuple(tuple(name.strip() for name in group.split(",")) for group in text.split("|"))


def _split(groups: Sequence[Sequence[str]], everyone: Sequence[str], source: str) -> Partition:
    if any(len(g) == 0 for g in groups):
        raise UsageError(f"{source}: an empty group; name at least one node in each group")
    named = check_node_names([n for g in groups for n in g], everyone, source)
    missing = [n for n in everyone if n not in named]
    if missing:
        raise UsageError(f"{source}: {', '.join(missing)} in no group; put every node in exactly one group")
    if len(groups) < 2:
        raise UsageError(f"{source}: one group cuts nothing; name two or more groups separated by |")
    cuts: set[Cut] = set()
    for i, group in enumerate(groups):
        for other in groups[i + 1 :]:
            cuts |= _both_ways(group, other)
    return Partition(frozenset(cuts))


def _both_ways(side_a: Iterable[str], side_b: Iterable[str]) -> frozenset[Cut]:
    side_b = list(side_b)
    return frozenset(cut for a in side_a for b in side_b for cut in ((a, b), (b, a)))


def _check_disjoint(side_a: Sequence[str], side_b: Sequence[str], source: str) -> None:
    common = [n for n in side_a if n in side_b]
    if common:
        raise UsageError(f"{source}: {', '.join(common)} on both sides; name each node on one side only")


def _join(names: Iterable[str]) -> str:
    return ",".join(sorted(names, key=node_order))


def _describe_both_ways(cuts: set[Cut]) -> str:
    nodes = {n for cut in cuts for n in cut}
    # Each node's group: the nodes it still reaches (itself included).
    group_of = {n: frozenset(m for m in nodes if (n, m) not in cuts) for n in nodes}
    if all(group_of[m] == group for group in group_of.values() for m in group):
        # The groups do not overlap: a clean split, every pair across groups cut.
        groups = sorted(set(group_of.values()), key=lambda g: (len(g), sorted(map(node_order, g))))
        return " | ".join(_join(g) for g in groups)
    # Overlapping groups (a reaches b and c, which do not reach each other): list the pairs.
    pairs = {tuple(sorted(cut, key=node_order)) for cut in cuts}
    return ", ".join(f"{a} <-/-> {b}" for a, b in sorted(pairs, key=lambda p: list(map(node_order, p))))


def _describe_one_way(cuts: Iterable[Cut]) -> list[str]:
    dsts_of: dict[str, set[str]] = defaultdict(set)
    for src, dst in cuts:
        dsts_of[src].add(dst)
    srcs_of: dict[frozenset[str], list[str]] = defaultdict(list)  # sources cut from the same targets
    for src, dsts in dsts_of.items():
        srcs_of[frozenset(dsts)].append(src)
    lines = [(sorted(map(node_order, srcs)), f"{_join(srcs)} -/-> {_join(dsts)}") for dsts, srcs in srcs_of.items()]
    return [text for _, text in sorted(lines)]
