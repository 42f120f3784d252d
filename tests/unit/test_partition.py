import re

import pytest

from sim.core.errors import UsageError
from sim.core.partition import (
    Partition,
    blocked_peers,
    cut_from,
    isolate,
    one_way,
    parse_groups,
    split,
)

FOUR = ["node0", "node1", "node2", "node3"]
FIVE = FOUR + ["node4"]
WITH_ETCD = FOUR + ["etcd"]


def both_ways(side_a, side_b):
    return {(a, b) for a in side_a for b in side_b} | {(b, a) for a in side_a for b in side_b}


def test_isolate_one_cuts_it_from_everyone_else_both_ways():
    p = isolate(["node2"], WITH_ETCD)
    assert p.cuts == both_ways(["node2"], ["node0", "node1", "node3", "etcd"])
    assert p.describe() == "node2 | node0,node1,node3,etcd"


def test_isolate_several_keeps_them_together():
    p = isolate(["node0", "node1"], FOUR)
    assert p.cuts == both_ways(["node0", "node1"], ["node2", "node3"])
    assert ("node0", "node1") not in p.cuts


def test_isolate_each_alone_by_union():
    p = isolate(["node0"], FOUR) | isolate(["node1"], FOUR)
    assert ("node0", "node1") in p.cuts and ("node1", "node0") in p.cuts
    assert p.describe() == "node0 | node1 | node2,node3"


def test_describe_puts_the_smaller_group_first():
    p = split([FIVE[2:], FIVE[:2]], FIVE)
    assert p.cuts == both_ways(["node0", "node1"], ["node2", "node3", "node4"])
    assert p.describe() == "node0,node1 | node2,node3,node4"


def test_parse_groups_keeps_the_groups_as_typed():
    assert parse_groups("node0, node1|node2") == (("node0", "node1"), ("node2",))


def test_split_three_groups():
    p = split([["node0"], ["node1", "node2"], ["node3"]], FOUR)
    assert p.cuts == both_ways(["node0"], ["node1", "node2", "node3"]) | both_ways(["node3"], ["node1", "node2"])
    assert p.describe() == "node0 | node3 | node1,node2"


def test_cut_from_etcd_only_leaves_peers_connected():
    p = cut_from(["node2"], ["etcd"], WITH_ETCD)
    assert p.cuts == {("node2", "etcd"), ("etcd", "node2")}
    assert blocked_peers(p, "node2") == ({"etcd"}, {"etcd"})
    assert blocked_peers(p, "node0") == (frozenset(), frozenset())


def test_cut_from_peers_only_leaves_etcd_connected():
    p = cut_from(["node2"], ["node0", "node1", "node3"], WITH_ETCD)
    assert blocked_peers(p, "node2") == ({"node0", "node1", "node3"}, {"node0", "node1", "node3"})
    assert not any("etcd" in cut for cut in p.cuts)


def test_one_way_cuts_only_one_direction():
    p = one_way(["node2"], ["etcd"])
    assert p.cuts == {("node2", "etcd")}
    assert blocked_peers(p, "node2") == (frozenset(), {"etcd"})
    assert blocked_peers(p, "etcd") == ({"node2"}, frozenset())
    assert p.describe() == "node2 -/-> etcd"


def test_one_way_groups_sources_with_the_same_targets():
    assert one_way(["node1", "node0"], ["etcd"]).describe() == "node0,node1 -/-> etcd"


def test_union_combines_cuts():
    p = cut_from(["node0"], ["node1"], FOUR) | one_way(["node2"], ["node3"])
    assert p.cuts == {("node0", "node1"), ("node1", "node0"), ("node2", "node3")}
    assert p.describe() == "node0 | node1; node2 -/-> node3"


def test_describe_overlapping_cuts_lists_pairs():
    # node0 reaches node2 and node3, which do not reach each other: no clean groups.
    p = cut_from(["node0"], ["node1"], FOUR) | cut_from(["node2"], ["node3"], FOUR)
    assert p.describe() == "node0 <-/-> node1, node2 <-/-> node3"


def test_describe_sorts_node10_after_node2():
    names = [f"node{i}" for i in range(11)]
    assert isolate(["node0"], names).describe() == "node0 | " + ",".join(names[1:])


def test_empty_partition_is_healed():
    assert Partition().describe() == "no cuts"
    assert blocked_peers(Partition(), "node0") == (frozenset(), frozenset())


def test_typed_groups_are_split():
    """A partition as typed (a scenario's `groups`, `sim partition`): parse_groups, then split."""
    expected = split([["node0", "node1"], ["node2", "node3"]], FOUR)
    assert split(parse_groups("node0,node1|node2, node3"), FOUR) == expected


@pytest.mark.parametrize(
    "text, problem",
    [
        ("node0,node1|node1,node2,node3", "node 'node1' named twice"),
        ("node0|node1,node1,node2,node3", "node 'node1' named twice"),
        ("node0,node1|node2,node9", "unknown node 'node9'; known nodes: node0, node1, node2, node3"),
        ("node0,node1|node2", "node3 in no group"),
        ("node0,node1,node2,node3", "one group cuts nothing"),
        ("node0,node1|", "empty node name"),
        ("", "empty"),
    ],
)
def test_typed_groups_rejects(text, problem):
    with pytest.raises(UsageError, match=r"^partition '.*': " + re.escape(problem)):
        split(parse_groups(text), FOUR)


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: isolate(["node9"], FOUR), "isolate 'node9': unknown node 'node9'"),
        (lambda: isolate(FOUR, FOUR), "isolate 'node0,node1,node2,node3': that is every node"),
        (lambda: isolate([], FOUR), "isolate '': no nodes named"),
        (lambda: split([["node0", "node1"], ["node2"]], FOUR), "partition 'node0,node1 | node2': node3 in no group"),
        (lambda: split([["node0", "node1"], [], ["node2", "node3"]], FOUR), "an empty group"),
        (lambda: cut_from(["node0"], ["etcd"], FOUR), "cut 'node0' from 'etcd': unknown node 'etcd'"),
        (lambda: cut_from(["node0", "node1"], ["node1"], FOUR), "cut 'node0,node1' from 'node1': node1 on both sides"),
        (lambda: one_way(["node0"], ["node0"]), "one-way cut 'node0' -/-> 'node0': node0 on both sides"),
        (lambda: one_way(["node0", "node0"], ["node1"]), "node 'node0' named twice"),
        (lambda: Partition({("node0", "node0")}), "cut ('node0', 'node0'): a node cannot be cut from itself"),
        (lambda: Partition({("node0", "")}), "cut ('node0', ''): not a (src, dst) pair"),
    ],
)
def test_bad_shapes_raise_usage_error_naming_the_input(build, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        build()


def test_split_refuses_a_group_given_as_a_string():
    with pytest.raises(TypeError):
        split(["node0,node1", "node2,node3"], FOUR)


def test_partition_is_frozen_and_normalises_cuts_to_frozenset():
    p = Partition([("a", "b")])
    assert p.cuts == frozenset({("a", "b")}) and isinstance(p.cuts, frozenset)
    with pytest.raises(AttributeError):
        p.cuts = frozenset()
