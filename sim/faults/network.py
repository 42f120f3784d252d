"""Network faults: a node's link (loss, rate, netem), partitions as data applied by one mechanism
(`_apply_partitions`, as in Jepsen), and the interface lookup. The verbs of `Nemesis` (sim/faults/nemesis.py)
that act in a node's network namespace.
"""

from __future__ import annotations

import shlex
import uuid
from collections.abc import Sequence

from sim.core.errors import FaultError, SimError, UnsupportedFaultError, UsageError
from sim.core.nodes import node_order
from sim.engines.docker import ExecResult
from sim.faults import netcmd
from sim.faults.partition import Partition, blocked_peers
from sim.faults.verbbase import PROCESS_BOUND_FAULTS, _last


class NetworkFaults:
    def partition(self, partition: Partition) -> dict:
        """Add a partition to those in force and re-apply them all."""

        def install_cuts() -> dict:
            known = {c.node for c in self.cluster.containers()}
            unknown = sorted({node for cut in partition.cuts for node in cut} - known)
            if unknown:
                there = ", ".join(sorted(known, key=node_order)) or "nothing"
                raise UsageError(
                    f"partition: no {', '.join(unknown)} in cluster '{self.cluster.name}' (there: {there}); "
                    "name the cluster's nodes or etcd"
                )
            fault_id = f"partition-{uuid.uuid4().hex[:6]}"
            self._remember(
                {
                    "id": fault_id,
                    "fault": "partition",
                    "target": partition.describe(),
                    "cuts": sorted(map(list, partition.cuts)),
                }
            )
            try:
                rules = self._apply_partitions()
            except SimError:
                self._forget(fault_id)
                self._apply_partitions()
                raise
            cuts = sorted(map(list, partition.cuts))
            return {"id": fault_id, "partition": partition.describe(), "cuts": cuts, "rules": rules}

        return self.invoke("partition", partition.describe(), install_cuts)

    def link(
        self, target: str, *, loss_pct: float | None = None, rate_bps: int | None = None, netem: dict | None = None
    ) -> dict:
        """Degrade one node's link: random loss (iptables), bandwidth (tc tbf), or netem options."""
        netem = {k: v for k, v in (netem or {}).items() if v is not None}
        if loss_pct is None and rate_bps is None and not netem:
            raise UsageError("netem: nothing to do; give --loss, --rate, or --delay/--jitter/--duplicate/--corrupt")
        if rate_bps is not None and netem:
            raise UsageError(
                "netem: --rate and --delay/--jitter/--duplicate/--corrupt both replace the root qdisc; use one"
            )

        def shape_link() -> dict:
            name = self.resolve(target)
            argvs: list[list[str]] = []
            if loss_pct is not None:
                argvs += self._chain_setup(netcmd.LOSS_IN_CHAIN) + self._chain_setup(netcmd.LOSS_OUT_CHAIN)
                argvs += [netcmd.flush_chain(netcmd.LOSS_IN_CHAIN), netcmd.flush_chain(netcmd.LOSS_OUT_CHAIN)]
                argvs += netcmd.loss_rules(loss_pct)
            iface = None
            if rate_bps is not None or netem:
                iface = self._iface(name)
                argvs.append(
                    netcmd.bandwidth_qdisc(iface, rate_bps)
                    if rate_bps is not None
                    else netcmd.netem_qdisc(iface, **netem)
                )
            fault_id = f"link-{name}"
            record = {
                "fault": "link",
                "target": name,
                "loss_pct": loss_pct,
                "rate_bps": rate_bps,
                "netem": netem,
                "iface": iface,
            }
            # The intent first (a new one replaces the node's link fault): rules installed by a call
            # interrupted while it ran are still cleared by heal.
            with self._claimed(fault_id, None, lambda: record):
                result = self._run_script(name, argvs)
                if not result.ok:
                    if netem and netcmd.netem_unsupported(result.stderr):
                        raise UnsupportedFaultError(
                            "netem: this kernel has no netem qdisc (delay, jitter, duplicate, corrupt); "
                            "use --loss or --rate, which work here (see `sim doctor`)"
                        )
                    raise FaultError(f"{name}: link fault failed: {_last(result.stderr)}")
            return {
                "id": fault_id,
                "node": name,
                "commands": [shlex.join(a) if isinstance(a, list) else a for a in argvs],
            }

        return self.invoke("link", target, shape_link, loss_pct=loss_pct, rate_bps=rate_bps, netem=netem)

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
        result = self.cluster.net_exec(node, "ip", "-o", "link", "show")
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
            if fault.fault == "partition":
                union = union | Partition(frozenset(fault.cuts))
        ips = self._ips()
        applied = {}
        for info in self.cluster.containers():
            if info.state != "running":
                continue
            drop_in, drop_out = blocked_peers(union, info.node)
            # A cut-off peer that is not running (killed, stopped, scaled away) has no address and sends nothing:
            # no rule for it now; its start re-applies the partitions with its new address (_reapply_network).
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

    def _reapply_network(self, *nodes: str) -> None:
        # A restarted or new container has a fresh network namespace: our rules are gone from it. With no
        # partition in force there is nothing to put back (heal flushed the chains): no exec at all, which
        # on a scale-up would compete with the new node's start for the CPU.
        if any(f.fault == "partition" for f in self.active()):
            self._apply_partitions()
        self._forget_faults_of(nodes, PROCESS_BOUND_FAULTS)

    def _run_script(self, node: str, argvs: Sequence[list[str] | str]) -> ExecResult:
        script = "set -e\n" + "\n".join(a if isinstance(a, str) else shlex.join(a) for a in argvs)
        return self.cluster.net_exec(node, "sh", "-c", script)
