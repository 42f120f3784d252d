"""Container faults: kill, stop, restart, start, pause or slow a whole node (or etcd), wipe etcd, scale.

Their kinds (sim/core/faultkinds/container.py, etcd.py) say what to do; here are the `Nemesis` methods for Python
callers (one line each) and what the executor does for their actions through the Docker provider.
"""

from __future__ import annotations

import time

from sim.core.faultkinds import NetworkBack, container, etcd
from sim.core.nodes import node_order
from sim.faults.targets import ETCD


class ContainerFaults:
    # --- the container family's verbs for Python callers: each carries out its kind (faultkinds/container.py)

    def kill_node(self, target: str) -> dict:
        """The whole node dies at once (SIGKILL to every process: `docker kill`)."""
        return self.carry_out(container.KILL_NODE, container.TargetOptions(target))

    def stop_node(self, target: str, *, grace: float = 10.0) -> dict:
        """Preemption: SIGTERM, then SIGKILL after `grace` seconds (`docker stop -t`)."""
        return self.carry_out(container.STOP_NODE, container.StopOptions(target, grace))

    def restart_node(self, target: str, *, grace: float = 0.0, downtime: float = 0.0) -> dict:
        """The same node (same hostname) comes back: a quick rejoin, or after `downtime`
        seconds down (a real restart takes seconds; whether a peer's call lands in the gap
        decides what torch does, so a scenario can make the gap certain)."""
        return self.carry_out(container.RESTART_NODE, container.RestartOptions(target, grace, downtime))

    def start_node(self, target: str) -> dict:
        """Start a node (or etcd) that was killed or stopped, keeping its data."""
        return self.carry_out(container.START_NODE, container.TargetOptions(target))

    def pause(self, target: str) -> dict:
        """Freeze every process of a node (cgroup freezer: `docker pause`)."""
        return self.carry_out(container.PAUSE, container.TargetOptions(target))

    def unpause(self, target: str) -> dict:
        return self.carry_out(container.UNPAUSE, container.TargetOptions(target))

    # --- what the executor does for the container family's actions

    def _restart_container(self, node: str, grace: float, downtime: float) -> None:
        cid = self._info(node).id
        if downtime > 0:
            self.docker.stop(cid, grace)
            time.sleep(downtime)
            self.docker.start(cid)
        else:
            self.docker.restart(cid, grace)

    def _stop_container(self, node: str, grace: float) -> float:
        started = time.monotonic()
        self.docker.stop(self._info(node).id, grace)
        return round(time.monotonic() - started, 2)

    def slow_node(self, target: str, *, cpus: float) -> dict:
        """A straggler: the node (or etcd) gets `cpus` CPUs' worth of time (cgroup CPU quota,
        `docker update --cpus`); its own limits come back with `heal`. (sim/core/faultkinds/container.py)"""
        return self.carry_out(container.SLOW_NODE, container.SlowOptions(target, cpus))

    def wipe_etcd(self, *, downtime: float = 0.0) -> dict:
        """Restart etcd with an empty data dir: every rendezvous key is gone (sim/core/faultkinds/etcd.py)."""
        return self.carry_out(etcd.WIPE_ETCD, etcd.WipeOptions(downtime), target=ETCD)

    def scale(self, nodes: int, *, abrupt: bool = False, grace: float = 10.0) -> dict:
        """Run exactly node0..node{nodes-1}: new nodes join the running job (torch decides whether now or as
        spares); the highest ones leave, gracefully (`docker stop -t grace`) or abruptly (`docker kill`)."""
        return self.carry_out(container.SCALE, container.ScaleOptions(nodes, abrupt, grace))

    def _scale_nodes(self, nodes: int, abrupt: bool, grace: float) -> dict:
        existing = {c.node: c for c in self.cluster.nodes()}
        wanted = [f"node{i}" for i in range(nodes)]
        leaving = sorted(
            (n for n, c in existing.items() if n not in wanted and c.state in ("running", "paused")),
            key=node_order,
            reverse=True,
        )
        for name in leaving:
            info = existing[name]
            if info.state == "paused":
                self.docker.unpause(info.id)
            if abrupt:
                self.docker.kill(info.id, "SIGKILL")
            else:
                self.docker.stop(info.id, grace)
            self.docker.remove("container", [info.id])
            # Everything of the node went with its container, but a filler on the shared volume.
            self._forget_faults_of([name], kinds=None, keep=lambda f: f.on_shared_volume)
        joining = [n for n in wanted if n not in existing or existing[n].state not in ("running", "paused")]
        if joining:
            self.cluster.start_nodes(joining, nodes=nodes)
            self._carry_all([NetworkBack(node) for node in joining])  # fresh network namespaces
        return {"joined": joining, "left": leaving}
