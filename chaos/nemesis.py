"""The nemesis: every fault on a running cluster, each through one audited call.

As in Blockade, each verb goes through `Nemesis.invoke`, which appends an
`invoke` record to the run's history before acting and an `ok` (with what was
actually done: the pid signalled, the rules installed) or `fail` (with why)
after. Nothing is injected without a record. As in Jepsen, partitions are data
(chaos.partition) applied by one mechanism (`_apply_partitions`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import posixpath
import random
import shlex
import signal as signals
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from sim.core.errors import FaultError, SimError, UnsupportedFaultError, UsageError
from sim.core.faultkinds import in_force_kinds
from sim.core.history import FILE_NAME, History
from sim.core.nodes import node_order
from sim.engines.cluster import Cluster, ContainerInfo
from sim.engines.docker import NO_MEMORY_LIMIT, ExecResult, ExecTimeout
from sim.engines.procs import PROBE_ARGV, NodeProcesses, Worker, parse_probe
from sim.engines.render import CLOCK_OFFSET_FILE
from sim.engines.swarm import refusal

from . import netcmd, nodescripts
from .partition import Partition, blocked_peers
from .targets import ETCD

CPU_PERIOD_US = 100_000  # the CFS period a CPU quota is a share of
# Faults in force that live in a node's processes or network namespace: they end when its container stops
# or restarts.
PROCESS_BOUND_FAULTS = in_force_kinds(lambda kind: kind.lives_in_node)
SHARED_CKPT_DIR = "/ckpt"  # where every node mounts the cluster's one checkpoint volume (compose/cluster.yaml)
OOM_HEADROOM = 64 * 2**20  # oom-worker: the node's limit, this much above its use
OOM_WITHIN_S = 30.0  # oom-worker: how long the memory hog may take
FILL_AT_MOST = 16 * 2**30  # fill-disk refuses a disk with more free than this: the host's own
WRITER_POLL_S = 0.5  # in-write faults on rank0: how often to look for the restarted group's rank 0
# skew-clock: write the offset ($1) to the node's offset file ($2), then a new process measures its clock
# against the kernel's (elastic_sim_clock.wall_clock). Exit CLOCK_NOT_PRELOADED: no libfaketime there.
CLOCK_NOT_PRELOADED = 3
CLOCK_SCRIPT = f"""case "$LD_PRELOAD" in *faketime*) ;; *) exit {CLOCK_NOT_PRELOADED} ;; esac
printf '%s\\n' "$1" > "$2"
exec python3 -c 'import time, elastic_sim_clock; print(time.time() - elastic_sim_clock.wall_clock())'"""


class Nemesis:
    def __init__(self, cluster: Cluster, *, history: History | None = None, seed: int | None = None):
        self.cluster = cluster
        self.docker = cluster.docker
        self.history = history or History(cluster.run_dir / FILE_NAME)
        self.seed = seed if seed is not None else random.SystemRandom().randrange(2**31)
        self.rng = random.Random(self.seed)

    # --- the one audited call ----------------------------------------------------

    def invoke(self, fault: str, target: str | None, action: Callable[[], dict], **args) -> dict:
        refused = refusal(self.cluster, fault, target)  # a fault that cannot work here (multi-host Swarm)
        if refused:
            raise UnsupportedFaultError(refused)
        op = uuid.uuid4().hex[:8]
        base = {"type": "fault", "op": op, "fault": fault, "target": target}
        self.history.append({**base, "phase": "invoke", "args": args})
        try:
            result = action() or {}
        except ExecTimeout as error:
            # It may still run in the container: outcome unknown (Jepsen's :info), not a failure.
            self.history.append({**base, "phase": "info", "error": str(error)})
            raise
        except SimError as error:
            self.history.append({**base, "phase": "fail", "error": str(error)})
            raise
        except BaseException as error:
            # Unknown outcome (Jepsen's :info): it may or may not have happened.
            self.history.append({**base, "phase": "info", "error": f"{type(error).__name__}: {error}"})
            raise
        self.history.append({**base, "phase": "ok", "result": result})
        return {"op": op, **result}

    # --- targets -------------------------------------------------------------------

    def resolve(self, target: str, *, allow_etcd: bool = True) -> str:
        """A node name, or a role: random (seeded), store-host, rank0, etcd."""
        infos = {c.node: c for c in self.cluster.containers()}
        if target == ETCD:
            if not allow_etcd:
                raise UsageError("target 'etcd': this fault acts on a node's training processes; name a node")
            if ETCD not in infos:
                raise UsageError(
                    f"target 'etcd': cluster '{self.cluster.name}' has no etcd (its backend is c10d/static)"
                )
            return ETCD
        if target == "random":
            live = sorted((c.node for c in infos.values() if c.role == "node" and c.state == "running"), key=node_order)
            if not live:
                raise FaultError(f"target 'random': no running node in cluster '{self.cluster.name}'")
            return self.rng.choice(live)
        if target == "store-host":
            spec = self.cluster.spec
            if spec is not None and spec.uses_etcd:
                raise UsageError("target 'store-host': with the etcd backends the store is etcd; target 'etcd' instead")
            return "node0"
        if target == "rank0":
            for info in sorted(infos.values(), key=lambda c: node_order(c.node)):
                if info.role == "node" and info.state == "running" and self.processes(info.node).group_rank == 0:
                    return info.node
            raise FaultError("target 'rank0': no running node has a worker group of rank 0 right now")
        if target not in infos:
            known = ", ".join(sorted(infos, key=node_order)) or "none"
            raise UsageError(
                f"target '{target}': no such node in cluster '{self.cluster.name}'; use one of {known}, "
                f"or random, store-host, rank0"
            )
        return target

    def processes(self, node: str) -> NodeProcesses:
        result = self.cluster.exec(
            node, *PROBE_ARGV
        )  # as the training user: root lacks CAP_SYS_PTRACE to read its environ
        if not result.ok:
            raise FaultError(f"{node}: cannot read its processes ({_last(result.stderr)}); is it running, not paused?")
        return parse_probe(result.stdout)

    def _info(self, node: str) -> ContainerInfo:
        return self.cluster.container(node)

    # --- process faults -------------------------------------------------------------

    def kill_worker(
        self,
        target: str = "random",
        *,
        rank: int | None = None,
        local_rank: int | None = None,
        sig: signals.Signals = signals.SIGKILL,
    ) -> dict:
        """Signal one training worker: by global rank (anywhere), or by local rank / at random on a node."""

        def signal_worker() -> dict:
            node, worker = self._pick_worker(target, rank, local_rank)
            self._signal(node, worker.pid, sig)
            return {
                "node": node,
                "pid": worker.pid,
                "rank": worker.rank,
                "local_rank": worker.local_rank,
                "signal": sig.name,
            }

        return self.invoke(
            "kill-worker",
            _worker_target(target, rank),
            signal_worker,
            rank=rank,
            local_rank=local_rank,
            signal=sig.name,
            seed=self.seed,
        )

    def hang_worker(self, target: str = "random", *, rank: int | None = None, local_rank: int | None = None) -> dict:
        """SIGSTOP one worker process (not its node): its agent still sees it alive, and its peers
        block in their next collective until the process group times out."""

        def stop_worker() -> dict:
            node, worker = self._pick_worker(target, rank, local_rank)
            fault_id = f"hang-{node}-{worker.pid}"
            record = {"fault": "hang", "target": node, "pid": worker.pid, "detail": f"rank {worker.rank} stopped"}
            with self._claimed(fault_id, f"{node}: worker {worker.pid} is stopped already", lambda: record):
                self._signal(node, worker.pid, signals.SIGSTOP)
            return {
                "id": fault_id,
                "node": node,
                "pid": worker.pid,
                "rank": worker.rank,
                "local_rank": worker.local_rank,
            }

        return self.invoke(
            "hang-worker", _worker_target(target, rank), stop_worker, rank=rank, local_rank=local_rank, seed=self.seed
        )

    def hang_collectives(
        self, target: str = "random", *, rank: int | None = None, local_rank: int | None = None
    ) -> dict:
        """One worker stops calling collectives while its process runs on (a hang inside the script):
        the node image's instrumentation holds it before its next collective while a file exists."""

        def hold_collectives() -> dict:
            node, worker = self._pick_worker(target, rank, local_rank)
            path = nodescripts.COLLECTIVE_HANG_FILE.format(pid=worker.pid)
            fault_id = f"stall-{node}-{worker.pid}"
            record = {
                "fault": "stall",
                "target": node,
                "file": path,
                "detail": f"rank {worker.rank} holds before its next collective",
            }
            with self._claimed(fault_id, f"{node}: worker {worker.pid} is held already", lambda: record):
                touched = self.cluster.exec(node, "touch", path)
                if not touched.ok:
                    raise FaultError(f"{node}: cannot create {path}: {_last(touched.stderr)}")
            return {
                "id": fault_id,
                "node": node,
                "pid": worker.pid,
                "rank": worker.rank,
                "local_rank": worker.local_rank,
                "file": path,
            }

        return self.invoke(
            "hang-collectives",
            _worker_target(target, rank),
            hold_collectives,
            rank=rank,
            local_rank=local_rank,
            seed=self.seed,
        )

    def resume_worker(self, target: str) -> dict:
        """SIGCONT every worker of a node (those not stopped ignore it)."""

        def continue_workers() -> dict:
            node = self.resolve(target, allow_etcd=False)
            pids = [w.pid for w in self.processes(node).workers]
            for pid in pids:
                self._signal(node, pid, signals.SIGCONT)
            healed = []
            for fault in self.active():
                if fault["fault"] == "hang" and fault["target"] == node:
                    self._forget(fault["id"])
                    healed.append(fault["id"])
            return {"node": node, "pids": pids, "healed": healed}

        return self.invoke("resume-worker", target, continue_workers)

    def oom_worker(
        self,
        target: str = "random",
        *,
        rank: int | None = None,
        local_rank: int | None = None,
        headroom: int = OOM_HEADROOM,
    ) -> dict:
        """The kernel's OOM killer kills one worker. Its node gets a memory limit `headroom` bytes
        above what it uses now (kept if it has one already, e.g. from `memory` in the spec), the
        worker is made the OOM killer's first choice (oom_score_adj 1000, which any process may raise
        for its own user's), and a helper process in the node allocates until the worker is gone.
        The script is untouched; the limit is lifted again at once."""

        def exhaust_memory() -> dict:
            node, worker = self._pick_worker(target, rank, local_rank)
            cid = self._info(node).id
            before = self.docker.resources(cid)
            limit = before.memory if 0 < before.memory < NO_MEMORY_LIMIT else self._memory_used(node) + headroom
            adjusted = self.cluster.exec(node, "sh", "-c", f"echo 1000 > /proc/{worker.pid}/oom_score_adj")
            if not adjusted.ok:
                raise FaultError(
                    f"{node}: cannot make worker {worker.pid} the OOM killer's choice: {_last(adjusted.stderr)}"
                )
            if limit != before.memory:
                self.docker.update_resources(cid, memory=limit)
            try:
                hog = self.cluster.exec(
                    node,
                    *nodescripts.argv(nodescripts.HOG, worker.pid, 2 * limit, OOM_WITHIN_S),
                    timeout=OOM_WITHIN_S + 15,
                )
            finally:
                if limit != before.memory:
                    self.docker.update_resources(cid, memory=before.memory or NO_MEMORY_LIMIT)
            if hog.stdout.strip():
                done = nodescripts.parse_result(node, "memory hog", hog.stdout)
            else:
                # The hog was the kernel's second victim (a retry while the worker's memory was being
                # freed; its oom_score_adj puts it before the agent): see for ourselves.
                gone = all(w.pid != worker.pid for w in self.processes(node).workers)
                done = {"worker_died": gone, "allocated": None, "hog_killed": True}
            if not done.get("worker_died"):
                raise FaultError(
                    f"{node}: worker {worker.pid} survived {(done.get('allocated') or 0) >> 20} MiB "
                    f"allocated over a {limit >> 20} MiB limit"
                )
            return {
                "node": node,
                "pid": worker.pid,
                "rank": worker.rank,
                "local_rank": worker.local_rank,
                "limit": limit,
                "allocated": done["allocated"],
                "limit_kept": limit == before.memory,
                "oom_kills": done.get("oom_kills"),
                "hog_killed": done.get("hog_killed", False),
            }

        return self.invoke(
            "oom-worker", _worker_target(target, rank), exhaust_memory, rank=rank, local_rank=local_rank, seed=self.seed
        )

    def _memory_used(self, node: str) -> int:
        """Bytes the node's cgroup uses now (cgroup v2's memory.current, or v1's usage_in_bytes)."""
        read = self.cluster.exec(
            node,
            "sh",
            "-c",
            "cat /sys/fs/cgroup/memory.current 2>/dev/null || cat /sys/fs/cgroup/memory/memory.usage_in_bytes",
        )
        if not read.ok or not read.stdout.strip().isdigit():
            raise FaultError(f"{node}: cannot read its memory use: {_last(read.stderr or read.stdout)}")
        return int(read.stdout.strip())

    def kill_during_checkpoint(
        self,
        target: str = "rank0",
        *,
        directory: str = SHARED_CKPT_DIR,
        within: float = 60.0,
        sig: signals.Signals = signals.SIGKILL,
    ) -> dict:
        """Signal the worker of a node that opens a file under `directory` for writing, the moment
        it does (within `within` seconds): a kill inside a checkpoint write, by design, not by luck."""

        def kill_the_writer() -> dict:
            node, left = self._writer_node(target, within)
            return {"node": node, "signal": sig.name, **self._signal_in_write(node, directory, left, sig)}

        return self.invoke(
            "kill-during-checkpoint", target, kill_the_writer, directory=directory, within=within, signal=sig.name
        )

    def _writer_node(self, target: str, within: float) -> tuple[str, int]:
        """The node whose worker will write, and the seconds left of `within`: rank 0's node is waited
        for while a restarted group has not started its workers yet (a fault right after a recovery)."""
        deadline = time.monotonic() + within
        while True:
            try:
                node = self.resolve(target, allow_etcd=False)
                return node, max(1, math.ceil(deadline - time.monotonic()))
            except FaultError:
                if target != "rank0" or time.monotonic() + WRITER_POLL_S >= deadline:
                    raise
            time.sleep(WRITER_POLL_S)

    def _signal_in_write(self, node: str, directory: str, within: float, sig: signals.Signals) -> dict:
        """Signal the first worker of `node` that opens a file under `directory` for writing, at once."""
        watched = self.cluster.exec(
            node, *nodescripts.argv(nodescripts.KILL_IN_WRITE, directory, within, int(sig)), timeout=within + 15
        )
        if watched.exit_code == nodescripts.NEVER_CAME:
            raise FaultError(f"{node}: {_last(watched.stderr)}")
        if not watched.ok:
            raise FaultError(f"{node}: watching for a checkpoint write failed: {_last(watched.stderr)}")
        return nodescripts.parse_result(node, "write watcher", watched.stdout)

    def freeze_during_checkpoint(
        self, target: str = "rank0", *, directory: str = SHARED_CKPT_DIR, within: float = 60.0
    ) -> dict:
        """Freeze a node in the middle of a checkpoint write: its worker is stopped (SIGSTOP) the moment it
        opens a file under `directory` for writing, then the whole node, agent included (`docker pause`).
        `heal` unpauses it and continues the worker (SIGCONT), which finishes its write as a worker of a
        round the others may have left by then: a zombie's write, late on purpose, not by luck."""

        def freeze_the_writer() -> dict:
            node, left = self._writer_node(target, within)
            fault_id = f"freeze-{node}"
            if any(f["id"] == fault_id for f in self.active()):
                raise UsageError(f"{node}: already frozen; `sim heal {fault_id}` first")
            caught = self._signal_in_write(node, directory, left, signals.SIGSTOP)
            try:
                self.docker.pause(self._info(node).id)
            except SimError:
                self.cluster.exec(node, "kill", "-CONT", str(caught["pid"]))
                raise
            self._remember(
                {
                    "id": fault_id,
                    "fault": "freeze",
                    "target": node,
                    "pid": caught["pid"],
                    "detail": f"frozen while pid {caught['pid']} writes {caught['file']}",
                }
            )
            return {"id": fault_id, "node": node, **caught}

        return self.invoke("freeze-during-checkpoint", target, freeze_the_writer, directory=directory, within=within)

    def _pick_worker(self, target: str, rank: int | None, local_rank: int | None) -> tuple[str, Worker]:
        node = self._node_of_rank(rank) if rank is not None else self.resolve(target, allow_etcd=False)
        procs = self.processes(node)
        if rank is not None:
            worker = procs.worker(rank=rank)
        elif local_rank is not None:
            worker = procs.worker(local_rank=local_rank)
        else:
            worker = self.rng.choice(procs.workers) if procs.workers else None
        if worker is None:
            which = (
                f"rank {rank}"
                if rank is not None
                else (f"local rank {local_rank}" if local_rank is not None else "any worker")
            )
            raise FaultError(
                f"{node}: no running worker with {which} (workers: "
                f"{[w.rank for w in procs.workers] or 'none'}); is the job between restarts?"
            )
        return node, worker

    def kill_agent(self, target: str, *, sig: signals.Signals = signals.SIGKILL) -> dict:
        """Signal the torchrun agent itself. SIGKILL: abrupt; SIGTERM: torchrun's graceful path."""

        def signal_agent() -> dict:
            node = self.resolve(target, allow_etcd=False)
            procs = self.processes(node)
            if procs.agent_pid is None:
                raise FaultError(f"{node}: no torchrun agent is running")
            self._signal(node, procs.agent_pid, sig)
            return {"node": node, "pid": procs.agent_pid, "signal": sig.name, "workers": [w.pid for w in procs.workers]}

        return self.invoke("kill-agent", target, signal_agent, signal=sig.name, seed=self.seed)

    def _signal(self, node: str, pid: int, sig: signals.Signals) -> None:
        # As the container's own user, the one the agent and workers run as: root would need CAP_KILL to
        # signal them, and the nodes drop every capability but NET_ADMIN.
        result = self.cluster.exec(node, "kill", f"-{sig.name.removeprefix('SIG')}", str(pid))
        if not result.ok:
            raise FaultError(f"{node}: kill -{sig.name} {pid} failed: {_last(result.stderr)}")

    def _node_of_rank(self, rank: int) -> str:
        for info in self.cluster.nodes():
            if info.state == "running" and self.processes(info.node).worker(rank=rank):
                return info.node
        raise FaultError(f"rank {rank}: no running worker has it now (the world may be smaller, or restarting)")

    # --- container faults -------------------------------------------------------------

    def kill_node(self, target: str) -> dict:
        """The whole node dies at once (SIGKILL to every process: `docker kill`)."""

        def kill_container() -> dict:
            name = self.resolve(target)
            self.docker.kill(self._info(name).id, "SIGKILL")
            self._forget_faults_of([name], PROCESS_BOUND_FAULTS)
            return {"node": name}

        return self.invoke("kill-node", target, kill_container, seed=self.seed)

    def stop_node(self, target: str, *, grace: float = 10.0) -> dict:
        """Preemption: SIGTERM, then SIGKILL after `grace` seconds (`docker stop -t`)."""

        def stop_container() -> dict:
            name = self.resolve(target)
            started = time.monotonic()
            self.docker.stop(self._info(name).id, grace)
            self._forget_faults_of([name], PROCESS_BOUND_FAULTS)
            return {"node": name, "grace": grace, "took": round(time.monotonic() - started, 2)}

        return self.invoke("stop-node", target, stop_container, grace=grace, seed=self.seed)

    def restart_node(self, target: str, *, grace: float = 0.0, downtime: float = 0.0) -> dict:
        """The same node (same hostname) comes back: a quick rejoin, or after `downtime`
        seconds down (a real restart takes seconds; whether a peer's call lands in the gap
        decides what torch does, so a scenario can make the gap certain)."""

        def restart_container() -> dict:
            name = self.resolve(target)
            cid = self._info(name).id
            if downtime > 0:
                self.docker.stop(cid, grace)
                time.sleep(downtime)
                self.docker.start(cid)
            else:
                self.docker.restart(cid, grace)
            self._reapply_network(name)
            return {"node": name, "grace": grace, "downtime": downtime}

        return self.invoke("restart-node", target, restart_container, grace=grace, downtime=downtime, seed=self.seed)

    def start_node(self, target: str) -> dict:
        """Start a node (or etcd) that was killed or stopped, keeping its data."""

        def start_container() -> dict:
            name = self.resolve(target)
            self.docker.start(self._info(name).id)
            self._reapply_network(name)
            return {"node": name}

        return self.invoke("start-node", target, start_container)

    def pause(self, target: str) -> dict:
        """Freeze every process of a node (cgroup freezer: `docker pause`)."""

        def pause_container() -> dict:
            name = self.resolve(target)
            info = self._info(name)
            if info.state == "paused":
                raise UsageError(f"{name}: already paused; `sim unpause {name}` resumes it")
            self.docker.pause(info.id)
            fault_id = f"pause-{name}"
            self._remember({"id": fault_id, "fault": "pause", "target": name, "detail": "frozen"})
            return {"id": fault_id, "node": name}

        return self.invoke("pause", target, pause_container, seed=self.seed)

    def unpause(self, target: str) -> dict:
        def unpause_container() -> dict:
            name = self.resolve(target)
            info = self._info(name)
            if info.state != "paused":
                raise UsageError(f"{name}: not paused (it is {info.state})")
            self.docker.unpause(info.id)
            self._forget(f"pause-{name}")
            return {"node": name}

        return self.invoke("unpause", target, unpause_container)

    def slow_node(self, target: str, *, cpus: float) -> dict:
        """A straggler: the node (or etcd) gets `cpus` CPUs' worth of time (cgroup CPU quota,
        `docker update --cpus`); its own limits come back with `heal`."""

        def throttle_cpu() -> dict:
            name = self.resolve(target)
            cid = self._info(name).id
            fault_id = f"slow-{name}"

            def record() -> dict:  # the limits to restore, read under the store's lock
                before = self.docker.resources(cid)
                return {"fault": "slow", "target": name, "detail": f"{cpus:g} CPUs"} | {
                    "cpu_quota": before.cpu_quota,
                    "cpu_period": before.cpu_period,
                }

            quota = max(1000, round(cpus * CPU_PERIOD_US))  # the kernel's least quota is 1 ms
            with self._claimed(fault_id, f"{name}: already slowed; `sim heal {fault_id}` first", record):
                self.docker.update_resources(cid, cpu_quota=quota, cpu_period=CPU_PERIOD_US)
            return {"id": fault_id, "node": name, "cpus": cpus, "cpu_quota": quota, "cpu_period": CPU_PERIOD_US}

        return self.invoke("slow-node", target, throttle_cpu, cpus=cpus)

    def skew_clock(self, target: str, *, by: float) -> dict:
        """Clock skew: the node's wall clock runs `by` seconds ahead (or behind, < 0) of the others'. Every
        process of a node preloads libfaketime, which reads the node's offset file (sim.engines.render): a new process
        at once, a running one within 2 s. The monotonic clock stays, as on a real machine. `heal` sets it
        back to 0. The result holds the offset a fresh process in the node then saw."""

        def shift_clock() -> dict:
            node = self.resolve(target, allow_etcd=False)
            fault_id = f"skew-{node}"
            refused = f"{node}: its clock is skewed already; `sim heal {fault_id}` first"
            with self._claimed(
                fault_id, refused, lambda: {"fault": "skew", "target": node, "detail": f"clock {by:+g} s"}
            ):
                seen = self._set_clock_offset(node, by)
            return {"id": fault_id, "node": node, "by": by, "seen": seen}

        return self.invoke("skew-clock", target, shift_clock, by=by)

    def _set_clock_offset(self, node: str, seconds: float) -> float:
        """Write the node's clock offset, then the offset a new process there sees (its clock minus the kernel's)."""
        result = self.cluster.exec(node, "sh", "-c", CLOCK_SCRIPT, "sh", f"{seconds:+.3f}", CLOCK_OFFSET_FILE)
        if result.exit_code == CLOCK_NOT_PRELOADED:
            raise UnsupportedFaultError(
                f"{node}: no libfaketime in its processes (a node image or cluster from before skew-clock); "
                f"`sim down` and `sim up` again"
            )
        try:
            return round(float(result.stdout.strip().splitlines()[-1]), 3)
        except (ValueError, IndexError):
            raise FaultError(f"{node}: setting its clock failed: {_last(result.stderr or result.stdout)}") from None

    # --- the checkpoint volume ------------------------------------------------------------

    def corrupt_checkpoint(
        self, target: str = "random", *, mode: str = "bitflip", directory: str = SHARED_CKPT_DIR
    ) -> dict:
        """Damage the newest file under `directory` (shared by every node): flip bits, or truncate it."""

        def damage_newest_checkpoint() -> dict:
            node = self.resolve(target, allow_etcd=False)
            done = self._node_script(
                node, "corrupting a checkpoint", nodescripts.CORRUPT, directory, mode, self.rng.randrange(2**31)
            )
            return {"node": node, **done}

        return self.invoke(
            "corrupt-checkpoint", target, damage_newest_checkpoint, mode=mode, directory=directory, seed=self.seed
        )

    def fill_disk(self, target: str = "random", *, directory: str = SHARED_CKPT_DIR, leave: int = 0) -> dict:
        """Fill the filesystem under `directory` with a filler file until `leave` bytes are free, so the
        next write fails with ENOSPC; `heal` removes the filler. Only a size-limited disk (the spec's
        `ckpt_size`): a larger one is refused, as filling it would fill the host's."""
        self._require_own_ckpt_storage(directory)

        def fill_checkpoint_disk() -> dict:
            node = self.resolve(target, allow_etcd=False)
            fault_id = f"fill-{node}"
            refused = f"{node}: a filler is in place already; `sim heal {fault_id}` first"
            # Recorded before it writes: the filler's path is the script's (the folder's .sim-filler).
            planned = {"fault": "fill", "target": node, "file": posixpath.join(directory, ".sim-filler")}
            with self._claimed(fault_id, refused, lambda: {**planned, "detail": "filler being written"}):
                done = self._node_script(node, "filling the disk", nodescripts.FILL, directory, leave, FILL_AT_MOST)
            self._remember(
                {**planned, "id": fault_id, "file": done["file"], "detail": f"{done['written'] >> 20} MiB filler"}
            )
            return {"id": fault_id, "node": node, **done}

        return self.invoke("fill-disk", target, fill_checkpoint_disk, directory=directory, leave=leave)

    def _require_own_ckpt_storage(self, directory: str) -> None:
        """A filler goes only on the cluster's own size-limited checkpoint storage: /ckpt (or a folder
        in it) of a cluster started with ckpt_size. The node script checks the mount itself too."""
        normal = posixpath.normpath(directory)
        if (
            not directory.startswith("/")
            or ".." in directory.split("/")
            or not (normal == SHARED_CKPT_DIR or normal.startswith(SHARED_CKPT_DIR + "/"))
        ):
            raise UsageError(
                f"--dir {directory!r}: fill-disk fills only the cluster's checkpoint storage; "
                f"give {SHARED_CKPT_DIR} or a folder in it"
            )
        spec = self.cluster.spec
        if spec is not None and spec.ckpt_size is None:
            raise UsageError(
                f"fill-disk: cluster '{self.cluster.name}' has no size-limited checkpoint storage; "
                "start it with --ckpt-size, e.g. --ckpt-size 64m"
            )

    def _node_script(self, node: str, what: str, script: str, *args: object) -> dict:
        result = self.cluster.exec(node, *nodescripts.argv(script, *args), timeout=120)
        if result.exit_code == nodescripts.WRONG_REQUEST:
            hint = "; give the cluster a size-limited one (ckpt_size)" if script is nodescripts.FILL else ""
            raise UsageError(f"{node}: {what}: {_last(result.stderr)}{hint}")
        if not result.ok:
            raise FaultError(f"{node}: {what} failed: {_last(result.stderr)}")
        return nodescripts.parse_result(node, what, result.stdout)

    # --- etcd -----------------------------------------------------------------------------

    def wipe_etcd(self, *, downtime: float = 0.0) -> dict:
        """Restart etcd with an empty data dir: every rendezvous key is gone. The data is
        unlinked while etcd runs (it keeps its open files until it stops), so etcd is down
        no longer than a plain restart, or for `downtime` seconds when given."""

        def restart_etcd_empty() -> dict:
            info = self._info(ETCD)
            removed = self.cluster.exec(ETCD, "sh", "-c", "rm -rf /var/lib/etcd/data")
            if not removed.ok:
                raise FaultError(f"etcd: clearing its data failed: {_last(removed.stderr)}")
            if downtime > 0:
                self.docker.kill(info.id, "SIGKILL")
                time.sleep(downtime)
                self.docker.start(info.id)
            else:
                self.docker.restart(info.id, 0)
            self._reapply_network(ETCD)
            return {"node": ETCD, "downtime": downtime}

        return self.invoke("wipe-etcd", ETCD, restart_etcd_empty, downtime=downtime)

    # --- scale ----------------------------------------------------------------------------------

    def scale(self, nodes: int, *, abrupt: bool = False, grace: float = 10.0) -> dict:
        """Run exactly node0..node{nodes-1}: new nodes join the running job (torch
        decides whether now or as spares); the highest ones leave, gracefully
        (`docker stop -t grace`) or abruptly (`docker kill`)."""
        if not isinstance(nodes, int) or nodes < 0:
            raise UsageError(f"scale --nodes {nodes!r}: must be a whole number >= 0")

        def change_node_count() -> dict:
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
                self._forget_faults_of(
                    [name], kinds=None, keep=lambda f: str(f.get("file", "")).startswith(SHARED_CKPT_DIR + "/")
                )
            joining = [n for n in wanted if n not in existing or existing[n].state not in ("running", "paused")]
            if joining:
                self.cluster.start_nodes(joining, nodes=nodes)
                self._reapply_network(*joining)
            return {"joined": joining, "left": leaving, "abrupt": abrupt}

        return self.invoke("scale", f"nodes={nodes}", change_node_count, nodes=nodes, abrupt=abrupt, grace=grace)

    # --- network ---------------------------------------------------------------------------

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

    def heal(self, fault_id: str | None = None) -> dict:
        """Undo one fault by id, or every reversible one (partitions, link faults, pauses)."""

        def undo_faults() -> dict:
            active = self.active()
            chosen = active if fault_id is None else [f for f in active if f["id"] == fault_id]
            if fault_id is not None and not chosen:
                ids = ", ".join(f["id"] for f in active) or "none"
                raise UsageError(f"fault '{fault_id}': not in force (in force: {ids}); `sim faults` lists them")
            healed, kept = [], []
            states = {c.node: c.state for c in self.cluster.containers()}
            # Pauses first: a paused node runs nothing, so its other faults are undone once it runs again.
            for fault in sorted(chosen, key=lambda f: f["fault"] not in ("pause", "freeze")):
                try:
                    self._heal_one(fault, states)
                except FaultError as error:
                    kept.append(f"{fault['id']} ({error})")
                    continue
                self._forget(fault["id"])
                healed.append(fault["id"])
            if fault_id is None:
                # Heal what reality holds too, even if our record of it was lost.
                for info in self.cluster.containers():
                    if info.state == "paused":
                        self.docker.unpause(info.id)
                for info in self.cluster.containers():
                    if info.state == "running":
                        self._clear_link(info.node, quiet=True)
            self._apply_partitions()
            if kept:
                raise FaultError(f"healed {', '.join(healed) or 'nothing'}; still in force: {'; '.join(kept)}")
            return {"healed": healed}

        return self.invoke("heal", fault_id or "all", undo_faults)

    def _heal_one(self, fault: dict, states: dict[str, str]) -> None:
        """Undo one fault. Its node may have been killed, stopped or scaled away since: what lived in its
        processes or its network namespace went with them (a pause, a link fault, a held or frozen worker);
        what lives in the container's settings or files stays with a stopped container (a CPU quota, a clock
        offset, a filler file), and a filler on the shared checkpoint volume outlives the container.
        FaultError: this one cannot be undone now (it stays in force)."""
        kind, node = fault["fault"], fault["target"]
        state = states.get(node)  # None: no such container (scaled away), or not a node (a partition)
        if kind in ("pause", "freeze") and state == "paused":
            self.docker.unpause(self._info(node).id)
            state = states[node] = "running"
        if kind == "link" and state == "running":
            self._clear_link(node)
        elif kind == "freeze" and state == "running":
            self.cluster.exec(node, "kill", "-CONT", str(fault["pid"]))  # the worker may be gone since: fine
        elif kind == "slow" and state is not None:  # a stopped container's quota applies again at its start
            self.docker.update_resources(
                self._info(node).id,
                cpu_quota=fault["cpu_quota"] or -1,
                cpu_period=fault["cpu_period"] or CPU_PERIOD_US,
            )
        elif kind == "skew" and state is not None:
            self._require_running(fault, node, state)
            self._set_clock_offset(node, 0)
        elif kind == "fill":
            shared = fault["file"].startswith(SHARED_CKPT_DIR + "/")
            if shared and state != "running":  # any running node reaches the shared volume
                node, state = next(
                    ((n, st) for n, st in states.items() if st == "running" and n != ETCD), (node, state)
                )
            if shared or state is not None:  # else: in the filesystem of a container removed since
                self._require_running(fault, node, state)
                self._remove_file(node, fault["file"])
        elif kind in ("hang", "stall") and state == "running":
            # The file that holds a worker (stall), or a SIGSTOPped worker (hang); gone with a stopped node.
            if kind == "hang":
                self.cluster.exec(node, "kill", "-CONT", str(fault["pid"]))
            else:
                self._remove_file(node, fault["file"])

    def _require_running(self, fault: dict, node: str, state: str | None) -> None:
        if state is None:
            raise FaultError(f"no running node reaches {fault['file']}; start one, then `sim heal {fault['id']}`")
        if state != "running":
            wake = "unpause" if state == "paused" else "start"
            raise FaultError(f"{node} is {state}; `sim {wake} {node}`, then `sim heal {fault['id']}`")

    def _remove_file(self, node: str, file: str) -> None:
        removed = self.cluster.exec(node, "rm", "-f", file)
        if not removed.ok:
            raise FaultError(f"{node}: removing {file} failed: {_last(removed.stderr)}")

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
            result = self._run_script(name, argvs)
            if not result.ok:
                if netem and netcmd.netem_unsupported(result.stderr):
                    raise UnsupportedFaultError(
                        "netem: this kernel has no netem qdisc (delay, jitter, duplicate, corrupt); "
                        "use --loss or --rate, which work here (see `sim doctor`)"
                    )
                raise FaultError(f"{name}: link fault failed: {_last(result.stderr)}")
            fault_id = f"link-{name}"
            self._remember(
                {
                    "id": fault_id,
                    "fault": "link",
                    "target": name,
                    "loss_pct": loss_pct,
                    "rate_bps": rate_bps,
                    "netem": netem,
                    "iface": iface,
                }
            )
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
        result = self.cluster.exec(node, "sh", "-c", "\n".join(lines), user="root")
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
        result = self.cluster.exec(node, *netcmd.iface_lookup_argv(peer), user="root")
        if not result.ok:
            raise FaultError(f"{node}: `ip route get {peer}` failed: {_last(result.stderr)}")
        return netcmd.parse_route_get(result.stdout)

    def _ifaces(self, node: str) -> tuple[str, ...]:
        result = self.cluster.exec(node, "ip", "-o", "link", "show", user="root")
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
            if fault["fault"] == "partition":
                union = union | Partition(frozenset(tuple(c) for c in fault["cuts"]))
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
        return self.cluster.exec(node, "iptables", "-w", "-S", netcmd.PARTITION_CHAIN, user="root").ok

    def _reapply_network(self, *nodes: str) -> None:
        # A restarted or new container has a fresh network namespace: our rules are gone from it. With no
        # partition in force there is nothing to put back (heal flushed the chains): no exec at all, which
        # on a scale-up would compete with the new node's start for the CPU.
        if any(f["fault"] == "partition" for f in self.active()):
            self._apply_partitions()
        self._forget_faults_of(nodes, PROCESS_BOUND_FAULTS)

    def _run_script(self, node: str, argvs: Sequence[list[str] | str]) -> ExecResult:
        script = "set -e\n" + "\n".join(a if isinstance(a, str) else shlex.join(a) for a in argvs)
        return self.cluster.exec(node, "sh", "-c", script, user="root")

    # --- faults in force (a small file beside the compose file) ---------------------------

    @property
    def _faults_file(self) -> Path:
        return self.cluster.state_dir / "faults.json"

    def active(self) -> list[dict]:
        if not self._faults_file.exists():
            return []
        return json.loads(self._faults_file.read_text())

    def _remember(self, fault: dict) -> None:
        with self._faults_locked() as faults:
            faults[:] = [f for f in faults if f["id"] != fault["id"]] + [{**fault, "since": time.time()}]

    @contextlib.contextmanager
    def _claimed(self, fault_id: str, refusal: str, record: Callable[[], dict]) -> Iterator[None]:
        """Record a fault in force before it acts: the "already in force?" check, the "before" values
        (`record()`) and the record, under the store's one lock, so two `sim` processes cannot both pass
        the check, nor save the other's fault as the value to restore; a crash while it acts leaves a
        record `heal --all` sees. A definite refusal while acting (a SimError, not a time-out) forgets it."""
        with self._faults_locked() as faults:
            if any(f["id"] == fault_id for f in faults):
                raise UsageError(refusal)
            faults.append({**record(), "id": fault_id, "since": time.time()})
        try:
            yield
        except ExecTimeout:
            raise  # it may have acted: the record stays for `heal`
        except SimError:
            self._forget(fault_id)
            raise

    def _forget(self, fault_id: str) -> None:
        with self._faults_locked() as faults:
            faults[:] = [f for f in faults if f["id"] != fault_id]

    def _forget_faults_of(
        self, nodes: Sequence[str], kinds: Sequence[str] | None, keep: Callable[[dict], bool] = lambda f: False
    ) -> None:
        """Forget the faults on these nodes (of these kinds; None: any) that ended with them, but those `keep` keeps."""
        with self._faults_locked() as faults:
            faults[:] = [
                f
                for f in faults
                if not (f["target"] in nodes and (kinds is None or f["fault"] in kinds) and not keep(f))
            ]

    @contextlib.contextmanager
    def _faults_locked(self) -> Iterator[list[dict]]:
        """The faults in force, to change in place: read, changed and written under one lock,
        since undo timers (threads) and other `sim` processes change the file too."""
        self._faults_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self._faults_file.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            faults = self.active()
            yield faults
            # Written to a temp name, then renamed: a reader without the lock never sees half a file.
            tmp = self._faults_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(faults, indent=2))
            os.replace(tmp, self._faults_file)


def _worker_target(target: str, rank: int | None) -> str:
    return target if rank is None else f"rank:{rank}"


def _last(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"
