import re

import pytest

from sim.core.errors import FaultError, UsageError
from sim.faults.netcmd import (
    LOSS_IN_CHAIN,
    LOSS_OUT_CHAIN,
    PARTITION_CHAIN,
    IfMissing,
    bandwidth_qdisc,
    chain_setup,
    clear_qdisc,
    flush_chain,
    iface_lookup_argv,
    loss_rules,
    netem_qdisc,
    netem_unsupported,
    parse_ip_link,
    parse_route_get,
    partition_rules,
)

IPT = ["iptables", "-w"]


def test_partition_chain_setup_checks_then_hooks_at_the_top_of_input_and_output():
    assert chain_setup(PARTITION_CHAIN) == [
        IfMissing(IPT + ["-S", "SIM-PARTITION"], IPT + ["-N", "SIM-PARTITION"]),
        IfMissing(IPT + ["-C", "INPUT", "-j", "SIM-PARTITION"], IPT + ["-I", "INPUT", "1", "-j", "SIM-PARTITION"]),
        IfMissing(IPT + ["-C", "OUTPUT", "-j", "SIM-PARTITION"], IPT + ["-I", "OUTPUT", "1", "-j", "SIM-PARTITION"]),
    ]


def test_loss_chains_hook_one_direction_each():
    assert [step.add for step in chain_setup(LOSS_IN_CHAIN)[1:]] == [IPT + ["-I", "INPUT", "1", "-j", "SIM-LOSS-IN"]]
    assert [step.add for step in chain_setup(LOSS_OUT_CHAIN)[1:]] == [IPT + ["-I", "OUTPUT", "1", "-j", "SIM-LOSS-OUT"]]


def test_flush_chain():
    assert flush_chain(PARTITION_CHAIN) == IPT + ["-F", "SIM-PARTITION"]


@pytest.mark.parametrize("call, chain", [(chain_setup, "INPUT"), (flush_chain, "DOCKER")])
def test_only_our_chains(call, chain):
    with pytest.raises(UsageError, match=re.escape(f"chain {chain!r}: not one of ours; use one of SIM-PARTITION")):
        call(chain)


def test_partition_rules_drop_in_and_out_sorted_by_address():
    assert partition_rules({"10.0.0.10", "10.0.0.9"}, ["10.0.0.3"]) == [
        IPT + ["-A", "SIM-PARTITION", "-s", "10.0.0.9", "-j", "DROP"],
        IPT + ["-A", "SIM-PARTITION", "-s", "10.0.0.10", "-j", "DROP"],
        IPT + ["-A", "SIM-PARTITION", "-d", "10.0.0.3", "-j", "DROP"],
    ]


def test_partition_rules_reject_resets_tcp_and_drops_the_rest():
    assert partition_rules(["10.0.0.2"], [], mode="reject") == [
        IPT + ["-A", "SIM-PARTITION", "-s", "10.0.0.2", "-p", "tcp", "-j", "REJECT", "--reject-with", "tcp-reset"],
        IPT + ["-A", "SIM-PARTITION", "-s", "10.0.0.2", "-j", "DROP"],
    ]


def test_partition_rules_nothing_blocked():
    assert partition_rules([], []) == []


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: partition_rules(["10.0.0.2"], [], mode="tarpit"), "partition mode 'tarpit': unknown"),
        (lambda: partition_rules(["node1"], []), "IP address 'node1': not an IPv4 address"),
        (lambda: partition_rules([], ["fe80::1"]), "IP address 'fe80::1': not an IPv4 address"),
    ],
)
def test_partition_rules_reject_bad_input(call, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        call()


def test_loss_rules_both_directions_spare_loopback():
    drop = ["-m", "statistic", "--mode", "random", "--probability", "0.3", "-j", "DROP"]
    assert loss_rules(30) == [
        IPT + ["-A", "SIM-LOSS-IN", "!", "-i", "lo"] + drop,
        IPT + ["-A", "SIM-LOSS-OUT", "!", "-o", "lo"] + drop,
    ]


@pytest.mark.parametrize("percent, probability", [(0.5, "0.005"), (33.3, "0.333"), (0.001, "0.00001"), (100, "1")])
def test_loss_probability_is_written_without_exponent_or_float_noise(percent, probability):
    (rule,) = loss_rules(percent, "out")
    assert rule[2:4] == ["-A", "SIM-LOSS-OUT"]
    assert rule[rule.index("--probability") + 1] == probability


def test_loss_rules_in_only():
    (rule,) = loss_rules(10, "in")
    assert rule[2:4] == ["-A", "SIM-LOSS-IN"]


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: loss_rules(0), "loss 0%: out of range"),
        (lambda: loss_rules(101), "loss 101%: out of range"),
        (lambda: loss_rules(5, "sideways"), "loss direction 'sideways': unknown"),
    ],
)
def test_loss_rules_reject_bad_input(call, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        call()


def test_bandwidth_qdisc_defaults():
    assert bandwidth_qdisc("eth1", 1_000_000) == [
        "tc",
        "qdisc",
        "replace",
        "dev",
        "eth1",
        "root",
        "tbf",
        "rate",
        "1000000bit",
        "burst",
        "1600",
        "latency",
        "50ms",
    ]


def test_bandwidth_qdisc_burst_holds_10ms_at_high_rates():
    argv = bandwidth_qdisc("eth0", 1_000_000_000, latency_ms=12.5)
    assert argv[argv.index("burst") + 1] == "1250000" and argv[-1] == "12.5ms"


def test_bandwidth_qdisc_explicit_burst():
    argv = bandwidth_qdisc("eth0", 1_000_000, burst_bytes=32000)
    assert argv[argv.index("burst") + 1] == "32000"


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: bandwidth_qdisc("eth0", 0), "rate 0 bit/s"),
        (lambda: bandwidth_qdisc("eth0", 1.5), "rate 1.5 bit/s"),
        (lambda: bandwidth_qdisc("eth0", 1000, burst_bytes=0), "burst 0 bytes"),
        (lambda: bandwidth_qdisc("eth0", 1000, latency_ms=0), "latency 0 ms"),
        (lambda: bandwidth_qdisc("", 1000), "interface ''"),
        (lambda: bandwidth_qdisc("eth0 root", 1000), "interface 'eth0 root'"),
        (lambda: bandwidth_qdisc("a-very-long-name0", 1000), "interface 'a-very-long-name0'"),
    ],
)
def test_bandwidth_qdisc_rejects_bad_input(call, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        call()


def test_netem_qdisc_all_options_in_tc_order():
    assert netem_qdisc(
        "eth0", delay_ms=100, jitter_ms=20, loss_pct=1, duplicate_pct=0.5, corrupt_pct=0.1, reorder_pct=25
    ) == [
        "tc",
        "qdisc",
        "replace",
        "dev",
        "eth0",
        "root",
        "netem",
        "delay",
        "100ms",
        "20ms",
        "loss",
        "1%",
        "duplicate",
        "0.5%",
        "corrupt",
        "0.1%",
        "reorder",
        "25%",
    ]


def test_netem_qdisc_loss_alone():
    assert netem_qdisc("eth0", loss_pct=30)[-3:] == ["netem", "loss", "30%"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({}, "netem: no options given"),
        ({"jitter_ms": 20}, "jitter 20ms without a delay"),
        ({"reorder_pct": 25}, "reorder 25% without a delay"),
        ({"delay_ms": -1}, "delay -1ms: negative"),
        ({"delay_ms": 10, "jitter_ms": -1}, "jitter -1ms: negative"),
        ({"loss_pct": 101}, "loss 101%: out of range"),
        ({"corrupt_pct": -1}, "corrupt -1%: out of range"),
    ],
)
def test_netem_qdisc_rejects_bad_input(kwargs, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        netem_qdisc("eth0", **kwargs)


def test_clear_qdisc():
    assert clear_qdisc("eth1") == ["tc", "qdisc", "del", "dev", "eth1", "root"]


@pytest.mark.parametrize(
    "stderr, unsupported",
    [
        ("Error: Specified qdisc kind is unknown.\n", True),
        ("Error: Specified qdisc not found.\n", True),
        ('Unknown qdisc "netem", hence option "delay" is unparsable\n', True),
        ("Error: Cannot delete qdisc with handle of zero.\n", False),
        ('Cannot find device "eth9"\n', False),
        ("", False),
    ],
)
def test_netem_unsupported(stderr, unsupported):
    assert netem_unsupported(stderr) is unsupported


def test_iface_lookup_argv():
    assert iface_lookup_argv("10.0.0.3") == ["ip", "-o", "route", "get", "10.0.0.3"]
    with pytest.raises(UsageError, match="IP address 'node3'"):
        iface_lookup_argv("node3")


@pytest.mark.parametrize(
    "output, iface",
    [
        ("10.0.0.3 dev eth1 src 10.0.0.2 uid 0 \\    cache \n", "eth1"),
        ("8.8.8.8 via 192.0.2.1 dev eth0 src 192.0.2.2 uid 0 \\    cache \n", "eth0"),
    ],
)
def test_parse_route_get(output, iface):
    assert parse_route_get(output) == iface


@pytest.mark.parametrize("output", ["", "RTNETLINK answers: Network is unreachable", "10.0.0.3 dev"])
def test_parse_route_get_without_dev_fails(output):
    with pytest.raises(FaultError, match="no 'dev' field"):
        parse_route_get(output)


IP_LINK = (
    "1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue state UNKNOWN mode DEFAULT group default qlen 1000\\"
    "    link/loopback 00:00:00:00:00:00 brd 00:00:00:00:00:00\n"
    "2: tunl0@NONE: <NOARP> mtu 1480 qdisc noop state DOWN mode DEFAULT group default qlen 1000\\"
    "    link/ipip 0.0.0.0 brd 0.0.0.0\n"
    "31: eth1@if32: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500"
    " qdisc noqueue state UP mode DEFAULT group default \\"
    "    link/ether 02:42:0a:00:00:02 brd ff:ff:ff:ff:ff:ff link-netnsid 0\n"
    "33: eth2@if34: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500"
    " qdisc noqueue state UP mode DEFAULT group default \\"
    "    link/ether 02:42:0a:00:01:02 brd ff:ff:ff:ff:ff:ff link-netnsid 0\n"
)


def test_parse_ip_link_lists_up_non_loopback_interfaces():
    assert parse_ip_link(IP_LINK) == ("eth1", "eth2")
