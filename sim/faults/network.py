"""Network faults: what the executor does for the network family's actions (sim/core/faultkinds/network.py):
partitions as data applied by one mechanism (`_apply_partitions`, as in Jepsen), a node's link shaped or
cleared, the interface lookup; and the family's `Nemesis` methods for Python callers (one line each). It acts in
a node's network namespace through the helper (Cluster.net_exec).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from sim.core.errors import FaultError, UnsupportedFaultError, UsageError
from sim.core.faultkinds import Act, FaultKind, NoOptions, ShapeLink, Struck, in_force_kinds, network
from sim.core.nodes import node_order
from sim.core.partition import Partition, blocked_peers
from sim.engines.docker import ExecResult
from sim.faults import netcmd
from sim.faults.targets import ETCD
from sim.faults.verbbase import PROCESS_BOUND_FAULTS, _last

_MS = ("delay", "jitter")  # netem settings given in ms, options in seconds
# The faults in force whose cuts the one mechanism applies.
_CUTTING = in_force_kinds(lambda kind: kind.cuts_links)


class NetworkFaults:
    # --- the network family's verbs for Python callers: each carries out its kind (faultkinds/network.py)

    def partition(self, partition: Partition) -> dict:
        """Add a partition (as data: sim.core.partition) to those in force and re-apply them all."""
        return self.carry_out(network.PARTITION, NoOptions(), struck=Struck(partition.describe(), cuts=partition.cuts))

    def link(
        self, target: str, *, loss_pct: float | None = None, rate_bps: int | None = None, netem: dict | None = None
    ) -> dict:
        """Degrade one node's link: random loss (iptables), bandwidth (tc tbf), or netem options (delay_ms,
        jitter_ms, duplicate_pct, corrupt_pct)."""
        netem = netem or {}
        ms = {
            name: None if netem.get(f"{name}_ms") is None else netem[f"{name}_ms"] / 1000
            for name in ("delay", "jitter")
        }
        try:
            options = network.NetemOptions(
                target,
                loss=loss_pct,
                rate=rate_bps,
                **ms,
                duplicate=netem.get("duplicate_pct"),
                corrupt=netem.get("corrupt_pct"),
            )
        except UsageError as error:
            raise UsageError(f"netem: {error}") from None
        return self.carry_out(network.LINK, options)

    # --- what the executor does for the network family's actions

    def _aim_links(self, act: Act, options, target: str | None) -> Struck:
        """The links a kind's options cut among the cluster's nodes (and etcd, when it has one)."""
        nodes = tuple(c.node for c in self.cluster.nodes())
        has_etcd = any(c.node == ETCD for c in self.cluster.containers())
        cut = act.links(options, target, nodes, has_etcd)
        return Struck(cut.describe(), cuts=cut.cuts)

    def _present(self, kind: FaultKind, struck: Struck) -> Struck:
        """The links given, refused when they name a node the cluster does not have."""
        known = {c.node for c in self.cluster.containers()}
        unknown = sorted({node for cut in struck.cuts for node in cut} - known)
        if unknown:
            there = ", ".join(sorted(known, key=node_order)) or "nothing"
            raise UsageError(
                f"{kind.name}: no {', '.join(unknown)} in cluster '{self.cluster.name}' (there: {there}); "
                "name the cluster's nodes or etcd"
            )
        return struck

    def _shape_link(self, action: ShapeLink) -> list[str]:
        argvs: list[list[str] | str] = []
        if action.loss_pct is not None:
            argvs += self._chain_setup(netcmd.LOSS_IN_CHAIN) + self._chain_setup(netcmd.LOSS_OUT_CHAIN)
            argvs += [netcmd.flush_chain(netcmd.LOSS_IN_CHAIN), netcmd.flush_chain(netcmd.LOSS_OUT_CHAIN)]
            argvs += netcmd.loss_rules(action.loss_pct)
        if action.rate_bps is not None:
            argvs.append(netcmd.bandwidth_qdisc(action.iface, action.rate_bps))
        elif action.netem:
            argvs.append(netcmd.netem_qdisc(action.iface, **action.netem))
        result = self._run_script(action.node, argvs)
        if not result.ok:
            if action.netem and netcmd.netem_unsupported(result.stderr):
                raise UnsupportedFaultError(
                    "netem: this kernel has no netem qdisc (delay, jitter, duplicate, corrupt); "
                    "use --loss or --rate, which work here (see `sim doctor`)"
                )
            raise FaultError(f"{action.node}: link fault failed: {_last(result.stderr)}")
        return [shlex.join(a) if isinstance(a, list) else a for a in argvs]

    def _clear_link(self, node: str, quiet: bool = False) -> None:
        lines = [
            f"{shlex.join(netcmd.flush_chain(c))} 2>/dev/null || true"
            for c in (netcmd.LOSS_IN_CHAIN, netcmd.LOSS_OUT_CHAIN)
        ]
        for iface in self._ifaces(node):
            lines.append(f"{shlex.join(netcmd.clear_qdisc(iface))} 2>/dev/null || true")
        result = self.cluster.net_exec(node, "sh", "-c", "\n".join(lines))
        if not result.ok and not quiet:
            raise FaultError(f"{node}: clearing link faults failed: {_last(result.stderr)}")

    def _iface(self, node: str) -> str:
        """The interface that carries cluster traffic; never assume eth0 (it is renamed on reconnect)."""
        peer = next((ip for name, ip in self._ips().items() if name != node), None)
        if peer is None:
            ifaces = self._ifaces(node)
            if not ifaces:
                raise FaultError(f"{node}: no network interface found")
            return ifaces[0]
        result = self.cluster.net_exec(node, *netcmd.iface_lookup_argv(peer))
        if not result.ok:
            raise FaultError(f"{node}: `ip route get {peer}` failed: {_last(result.stderr)}")
        return netcmd.parse_route_get(result.stdout)

    def _ifaces(self, node: str) -> tuple[str, ...]:
        result = self.cluster.net_exec(node, *netcmd.IP_LINK_ARGV)
        return netcmd.parse_ip_link(result.stdout) if result.ok else ()

    def _ips(self) -> dict[str, str]:
        """Each running container's address on the cluster network (its only one), looked up now."""
        return {
            c.node: ip for c in self.cluster.containers() if c.state in ("running", "paused") for ip in c.ips.values()
        }

    def _chain_setup(self, chain: str) -> list[str]:
        return [
            f"{shlex.join(step.check)} >/dev/null 2>&1 || {shlex.join(step.add)}" for step in netcmd.chain_setup(chain)
        ]

    def _apply_partitions(self) -> dict[str, list[str]]:
        """The one mechanism: the union of every partition in force, as iptables
        rules in each container's own namespace (flush, then add)."""
        union = Partition()
        for fault in self.active():
            if fault.fault in _CUTTING:
                union = union | Partition(frozenset(fault.cuts))
        ips = self._ips()
        applied = {}
        for info in self.cluster.containers():
            if info.state != "running":
                continue
            drop_in, drop_out = blocked_peers(union, info.node)
            # A cut-off peer that is not running (killed, stopped, scaled away) has no address and sends nothing:
            # no rule for it now; its start re-applies the partitions with its new address (_network_back).
            rules = netcmd.partition_rules(
                [ips[n] for n in sorted(drop_in) if n in ips], [ips[n] for n in sorted(drop_out) if n in ips]
            )
            if not rules and not self._has_chain(info.node):
                continue
            argvs = self._chain_setup(netcmd.PARTITION_CHAIN) + [netcmd.flush_chain(netcmd.PARTITION_CHAIN)] + rules
            result = self._run_script(info.node, argvs)
            if not result.ok:
                raise FaultError(f"{info.node}: applying partition rules failed: {_last(result.stderr)}")
            applied[info.node] = [shlex.join(r) for r in rules]
        return applied

    def _has_chain(self, node: str) -> bool:
        return self.cluster.net_exec(node, "iptables", "-w", "-S", netcmd.PARTITION_CHAIN).ok

    def _network_back(self, node: str) -> None:
        # A restarted or new container has a fresh network namespace: our rules are gone from it. With no
        # partition in force there is nothing to put back (heal flushed the chains): no exec at all, which
        # on a scale-up would compete with the new node's start for the CPU.
        if any(f.fault in _CUTTING for f in self.active()):
            self._apply_partitions()
        self._forget_faults_of([node], PROCESS_BOUND_FAULTS)

    def _run_script(self, node: str, argvs: Sequence[list[str] | str]) -> ExecResult:
        script = "set -e\n" + "\n".join(a if isinstance(a, str) else shlex.join(a) for a in argvs)
        return self.cluster.net_exec(node, "sh", "-c", script)
