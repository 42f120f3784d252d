"""argv builders for the commands that fault a node's network, run inside its network namespace.

Each command is a list of strings, never a shell line: the caller runs it as is, nothing needs
quoting, and unit tests assert it exactly. The nemesis runs them through Cluster.net_exec: in a
short-lived helper container of our base image that joins the node's network namespace (as Pumba
and Chaos Mesh do), so the node's image, ours or the team's own (--image), needs no iptables, tc or
ip. Parsers for the output of `ip` live here too. Nothing here runs a command.

iptables rules go only into our own chains, hooked at the top of INPUT and OUTPUT, so healing
is flushing our chain and Docker's own rules are never touched.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from decimal import Decimal
from typing import NamedTuple

from sim.core.errors import FaultError, UsageError

PARTITION_CHAIN = "SIM-PARTITION"
LOSS_IN_CHAIN = "SIM-LOSS-IN"
LOSS_OUT_CHAIN = "SIM-LOSS-OUT"

# The built-in chains that jump to each of ours. Partition rules match peer addresses (-s for
# packets in, -d for packets out), which already tells the direction, so one chain serves both.
# Loss matches any non-loopback packet, and a chain reached from both INPUT and OUTPUT cannot
# tell which way a packet goes ("! -i lo" also matches every outgoing packet, whose input
# interface is empty), so loss has one chain per direction.
HOOKS = {
    PARTITION_CHAIN: ("INPUT", "OUTPUT"),
    LOSS_IN_CHAIN: ("INPUT",),
    LOSS_OUT_CHAIN: ("OUTPUT",),
}

PARTITION_MODES = ("drop", "reject")
LOSS_DIRECTIONS = ("both", "in", "out")


class IfMissing(NamedTuple):
    """Run `check`; only if it exits non-zero, run `add`. Makes setup safe to repeat."""

    check: list[str]
    add: list[str]


def chain_setup(chain: str) -> list[IfMissing]:
    """Create `chain` and hook it at position 1 of its built-in chains, unless already done.

    Position 1 puts our DROPs before any ACCEPT (e.g. one for ESTABLISHED traffic), so a cut
    also stops connections that are already open, not just new ones."""
    hooks = _hooks(chain)
    steps = [IfMissing(_iptables("-S", chain), _iptables("-N", chain))]  # -S fails if there is no such chain
    steps += [IfMissing(_iptables("-C", hook, "-j", chain), _iptables("-I", hook, "1", "-j", chain)) for hook in hooks]
    return steps


def flush_chain(chain: str) -> list[str]:
    """Remove every rule from one of our chains: heals what its rules did."""
    _hooks(chain)
    return _iptables("-F", chain)


def partition_rules(
    drop_in_from_ips: Iterable[str], drop_out_to_ips: Iterable[str], mode: str = "drop"
) -> list[list[str]]:
    """Rules to append to PARTITION_CHAIN (after flushing it) that cut a node off from peers.

    mode "drop": packets vanish and peers find out by timeout, like a real partition.
    mode "reject": TCP is answered with a reset, so connections fail at once; other packets drop."""
    if mode not in PARTITION_MODES:
        raise UsageError(
            f"partition mode {mode!r}: unknown; use drop (packets vanish) or reject (TCP connections reset)"
        )
    rules = []
    for address_flag, ips in (("-s", drop_in_from_ips), ("-d", drop_out_to_ips)):
        for ip in _sorted_ips(ips):
            match = ["-A", PARTITION_CHAIN, address_flag, ip]
            if mode == "reject":
                rules.append(_iptables(*match, "-p", "tcp", "-j", "REJECT", "--reject-with", "tcp-reset"))
            rules.append(_iptables(*match, "-j", "DROP"))
    return rules


def loss_rules(percent: float, direction: str = "both") -> list[list[str]]:
    """Rules to append to LOSS_IN_CHAIN / LOSS_OUT_CHAIN that drop `percent` of packets at random.

    Loopback is spared: it is not the network, and workers on one node and Docker's DNS
    resolver (127.0.0.11) use it."""
    if not 0 < percent <= 100:
        raise UsageError(f"loss {percent}%: out of range; use more than 0 and at most 100 (heal removes loss)")
    if direction not in LOSS_DIRECTIONS:
        raise UsageError(f"loss direction {direction!r}: unknown; use in, out or both")
    drop_at_random = [
        "-m",
        "statistic",
        "--mode",
        "random",
        "--probability",
        _plain(Decimal(str(percent)) / 100),
        "-j",
        "DROP",
    ]
    rules = []
    if direction in ("in", "both"):
        rules.append(_iptables("-A", LOSS_IN_CHAIN, "!", "-i", "lo", *drop_at_random))
    if direction in ("out", "both"):
        rules.append(_iptables("-A", LOSS_OUT_CHAIN, "!", "-o", "lo", *drop_at_random))
    return rules


def bandwidth_qdisc(iface: str, rate_bps: int, burst_bytes: int | None = None, latency_ms: float = 50) -> list[str]:
    """Limit what leaves `iface` to `rate_bps` with a token bucket (tbf).

    By default the bucket holds 10 ms of traffic (so timer granularity does not cap the rate
    below what was asked) and at least one full Ethernet frame. `latency_ms` is how long a
    packet may wait in the queue before tbf drops it."""
    _check_iface(iface)
    if not (isinstance(rate_bps, int) and rate_bps > 0):
        raise UsageError(f"rate {rate_bps!r} bit/s: not a whole number above zero; use e.g. 1000000 (1mbit)")
    burst = max(rate_bps // 800, 1600) if burst_bytes is None else burst_bytes
    if not (isinstance(burst, int) and burst > 0):
        raise UsageError(f"burst {burst!r} bytes: not a whole number above zero; use e.g. 32000")
    if not latency_ms > 0:
        raise UsageError(f"latency {latency_ms!r} ms: not above zero; use e.g. 50")
    return [
        "tc",
        "qdisc",
        "replace",
        "dev",
        iface,
        "root",
        "tbf",
        "rate",
        f"{rate_bps}bit",
        "burst",
        str(burst),
        "latency",
        f"{_plain(latency_ms)}ms",
    ]


def netem_qdisc(
    iface: str,
    delay_ms: float | None = None,
    jitter_ms: float | None = None,
    loss_pct: float | None = None,
    duplicate_pct: float | None = None,
    corrupt_pct: float | None = None,
    reorder_pct: float | None = None,
) -> list[str]:
    """Delay, jitter, loss, duplication, corruption or reordering on what leaves `iface` (netem).
    Needs the kernel's netem qdisc; see netem_unsupported()."""
    _check_iface(iface)
    options: list[str] = []
    if delay_ms is not None:
        options += ["delay", _milliseconds("delay", delay_ms)]
        if jitter_ms is not None:
            options.append(_milliseconds("jitter", jitter_ms))
    elif jitter_ms is not None:
        raise UsageError(f"jitter {jitter_ms}ms without a delay: jitter varies the delay; give a delay too, e.g. 100ms")
    elif reorder_pct is not None:
        # netem reorders by sending some packets at once and delaying the rest.
        raise UsageError(
            f"reorder {reorder_pct}% without a delay: netem reorders only delayed packets; give a delay too, e.g. 10ms"
        )
    percentages = {"loss": loss_pct, "duplicate": duplicate_pct, "corrupt": corrupt_pct, "reorder": reorder_pct}
    for name, pct in percentages.items():
        if pct is not None:
            if not 0 <= pct <= 100:
                raise UsageError(f"{name} {pct}%: out of range; use a number from 0 to 100")
            options += [name, f"{_plain(pct)}%"]
    if not options:
        raise UsageError("netem: no options given; give at least one of delay, loss, duplicate, corrupt, reorder")
    return ["tc", "qdisc", "replace", "dev", iface, "root", "netem", *options]


def clear_qdisc(iface: str) -> list[str]:
    """Remove the root qdisc of `iface` (tbf or netem), back to the kernel's default.
    tc fails if there is none, so the caller treats that failure as already clear."""
    _check_iface(iface)
    return ["tc", "qdisc", "del", "dev", iface, "root"]


# Kernel without the netem qdisc ("kind is unknown"; some kernels say "not found") or a tc
# built without netem support.
_NETEM_MISSING = ("specified qdisc kind is unknown", "specified qdisc not found", 'unknown qdisc "netem"')


def netem_unsupported(stderr: str) -> bool:
    """Whether tc's stderr says this machine has no netem, as opposed to some other failure."""
    return any(phrase in stderr.lower() for phrase in _NETEM_MISSING)


def iface_lookup_argv(peer_ip: str) -> list[str]:
    """Ask the kernel which interface reaches `peer_ip`; names change after a network reconnect."""
    return ["ip", "-o", "route", "get", _check_ip(peer_ip)]


def parse_route_get(output: str) -> str:
    """The interface in `ip -o route get` output: "10.0.0.3 dev eth1 src 10.0.0.2 uid 0 \\    cache" -> "eth1"."""
    words = output.split()
    if "dev" not in words[:-1]:
        raise FaultError(
            f"ip route get said {output.strip()!r}: no 'dev' field; expected e.g. '10.0.0.3 dev eth0 src ...'"
        )
    return words[words.index("dev") + 1]


_LINK_LINE = re.compile(r"\s*\d+:\s+([^\s:@]+)(?:@\S*)?:\s+<([^>]*)>")


# Every interface of a node's namespace, one a line (parse_ip_link reads it).
IP_LINK_ARGV = ("ip", "-o", "link", "show")


def parse_ip_link(output: str) -> tuple[str, ...]:
    """Names of the interfaces that are up and not loopback in `ip -o link show` output.
    "eth0@if24" is "eth0"; interfaces that are down (tunl0, ifb0) carry no traffic."""
    names = []
    for line in output.splitlines():
        match = _LINK_LINE.match(line)
        if match:
            flags = match.group(2).split(",")
            if "UP" in flags and "LOOPBACK" not in flags:
                names.append(match.group(1))
    return tuple(names)


def _iptables(*args: str) -> list[str]:
    # -w: wait for the xtables lock instead of failing while another iptables runs.
    return ["iptables", "-w", *args]


def _hooks(chain: str) -> tuple[str, ...]:
    if chain not in HOOKS:
        raise UsageError(f"chain {chain!r}: not one of ours; use one of {', '.join(HOOKS)}")
    return HOOKS[chain]


def _check_ip(ip: str) -> str:
    try:
        return str(ipaddress.IPv4Address(ip))
    except ValueError:
        raise UsageError(f"IP address {ip!r}: not an IPv4 address; use e.g. 10.0.0.3") from None


def _sorted_ips(ips: Iterable[str]) -> list[str]:
    if isinstance(ips, str):
        raise TypeError(f"pass a collection of IP addresses, not the string {ips!r}")
    return sorted({_check_ip(ip) for ip in ips}, key=ipaddress.IPv4Address)


def _check_iface(iface: str) -> None:
    # The kernel's limits: at most 15 bytes, no whitespace or "/".
    if not re.fullmatch(r"[^\s/]{1,15}", iface or ""):
        raise UsageError(f"interface {iface!r}: not an interface name; use one from `ip -o link show`, e.g. eth0")


def _milliseconds(name: str, value: float) -> str:
    if not value >= 0:
        raise UsageError(f"{name} {value}ms: negative; use zero or more milliseconds, e.g. 100")
    return f"{_plain(value)}ms"


def _plain(number: float | Decimal) -> str:
    """A number as tc and iptables read it: no exponent, no trailing zeros (0.005, 100, 12.5)."""
    return format(Decimal(str(number)).normalize(), "f")
