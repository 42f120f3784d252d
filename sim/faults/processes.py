"""Process faults: what the executor does in a node's processes (the process and checkpoint families' kinds,
sim/core/faultkinds/process.py and checkpoint.py, say what to do): pick a worker, signal it, wait for a writer,
starve a node of memory; and the `Nemesis` methods for Python callers, one line each that carries out a kind.
"""

from __future__ import annotations

import math
import signal as signals
import time

from sim.core.errors import FaultError
from sim.core.faultkinds import Act, ContinueWorker, Struck, checkpoint, process
from sim.engines.docker import NO_MEMORY_LIMIT
from sim.engines.proctable import Worker
from sim.faults import nodescripts
from sim.faults.verbbase import SHARED_CKPT_DIR, _last

OOM_WITHIN_S = 30.0  # oom-worker: how long the memory hog may take
WRITER_POLL_S = 0.5  # in-write faults on rank0: how often to look for the restarted group's rank 0


class ProcessFaults:
    # --- the process family's verbs for Python callers: each carries out its kind (sim/core/faultkinds/process.py)

    def kill_worker(
        self,
        target: str = "random",
        *,
        rank: int | None = None,
        local_rank: int | None = None,
        sig: signals.Signals = signals.SIGKILL,
    ) -> dict:
        """Signal one training worker: by global rank (anywhere), or by local rank / at random on a node."""
        return self.carry_out(process.KILL_WORKER, process.KillWorkerOptions(target, rank, local_rank, sig))

    def hang_worker(self, target: str = "random", *, rank: int | None = None, local_rank: int | None = None) -> dict:
        """SIGSTOP one worker process (not its node): its agent still sees it alive, and its peers
        block in their next collective until the process group times out."""
        return self.carry_out(process.HANG_WORKER, process.WorkerOptions(target, rank, local_rank))

    def hang_collectives(
        self, target: str = "random", *, rank: int | None = None, local_rank: int | None = None
    ) -> dict:
        """One worker stops calling collectives while its process runs on (a hang inside the script):
        the node image's instrumentation holds it before its next collective while a file exists."""
        return self.carry_out(process.HANG_COLLECTIVES, process.WorkerOptions(target, rank, local_rank))

    def resume_worker(self, target: str) -> dict:
        """SIGCONT every worker of a node (those not stopped ignore it)."""
        return self.carry_out(process.RESUME_WORKER, process.NodeOptions(target))

    def oom_worker(self, target: str = "random", *, rank: int | None = None, local_rank: int | None = None) -> dict:
        """The kernel's OOM killer kills one worker (ExhaustMemory says how)."""
        return self.carry_out(process.OOM_WORKER, process.WorkerOptions(target, rank, local_rank))

    def kill_agent(self, target: str, *, sig: signals.Signals = signals.SIGKILL) -> dict:
        """Signal the torchrun agent itself. SIGKILL: abrupt; SIGTERM: torchrun's graceful path."""
        return self.carry_out(process.KILL_AGENT, process.KillAgentOptions(target, sig))

    # --- what the executor does for the process family's actions and targets

    def _strike(self, act: Act, options, target: str | None = None) -> Struck:
        """What a kind strikes, resolved from its options (or an entry's fixed target): a node, a worker of
        one, or a node's agent."""
        if act.strikes == "cluster":
            return Struck("")  # the cluster as a whole: no node to resolve
        if act.strikes == "writer":
            node, left = self._writer_node(options.target, options.within)
            return Struck(node, left=left)
        if act.strikes == "worker":
            node, worker = self._pick_worker(options.target, options.rank, options.local_rank)
            return Struck(node, worker.pid, worker.rank, worker.local_rank)
        node = self.resolve(target or options.target, allow_etcd=act.allow_etcd)
        if act.strikes == "agent":
            procs = self.processes(node)
            if procs.agent_pid is None:
                raise FaultError(f"{node}: no torchrun agent is running")
            return Struck(node, procs.agent_pid, workers=tuple(w.pid for w in procs.workers))
        return Struck(node)

    def _continue_workers(self, action: ContinueWorker) -> list[int]:
        """SIGCONT one worker, or (no pid) every worker of the node; a worker gone since is fine, but a signal
        resume-worker itself sends must be delivered (`strict`)."""
        pids = [action.pid] if action.pid is not None else [w.pid for w in self.processes(action.node).workers]
        for pid in pids:
            if action.strict:
                self._signal(action.node, pid, signals.SIGCONT)
            else:
                self.cluster.exec(action.node, "kill", "-CONT", str(pid))
        return pids

    def _touch(self, node: str, path: str) -> None:
        touched = self.cluster.exec(node, "touch", path)
        if not touched.ok:
            raise FaultError(f"{node}: cannot create {path}: {_last(touched.stderr)}")

    def _exhaust_memory(self, node: str, pid: int, headroom: int) -> dict:
        """Its node gets a memory limit `headroom` bytes above what it uses now (its default limit when lower;
        one from `memory` in the spec is kept), the worker is made the OOM killer's first choice
        (oom_score_adj 1000, which any process may raise for its own user's), and a helper process in the
        node allocates until the worker is gone. The script is untouched; the limit is lifted again at once."""
        cid = self._info(node).id
        before = self.docker.resources(cid)
        limited = 0 < before.memory < NO_MEMORY_LIMIT
        spec = self.cluster.spec
        if limited and (spec is None or spec.memory is not None):
            limit = before.memory  # the spec's own `memory`: kept
        else:
            # The default limit bounds a runaway node, mostly far above its use: the hog would have to
            # fill all of it, so the node gets less for the while (then its limit back).
            limit = self._memory_used(node) + headroom
            limit = min(limit, before.memory) if limited else limit
        adjusted = self.cluster.exec(node, "sh", "-c", f"echo 1000 > /proc/{pid}/oom_score_adj")
        if not adjusted.ok:
            raise FaultError(f"{node}: cannot make worker {pid} the OOM killer's choice: {_last(adjusted.stderr)}")
        if limit != before.memory:
            self.docker.update_resources(cid, memory=limit)
        try:
            hog = self.cluster.exec(
                node,
                *nodescripts.argv(nodescripts.HOG, pid, 2 * limit, OOM_WITHIN_S),
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
            gone = all(w.pid != pid for w in self.processes(node).workers)
            done = {"worker_died": gone, "allocated": None, "hog_killed": True}
        if not done.get("worker_died"):
            raise FaultError(
                f"{node}: worker {pid} survived {(done.get('allocated') or 0) >> 20} MiB "
                f"allocated over a {limit >> 20} MiB limit"
            )
        return {
            "limit": limit,
            "allocated": done["allocated"],
            "limit_kept": limit == before.memory,
            "oom_kills": done.get("oom_kills"),
            "hog_killed": done.get("hog_killed", False),
        }

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
        """Signal the worker of a node that opens a file under `directory` for writing, the moment it does
        (sim/core/faultkinds/checkpoint.py)."""
        options = checkpoint.KillInWriteOptions(target, directory, within, sig)
        return self.carry_out(checkpoint.KILL_DURING_CHECKPOINT, options)

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

    def _signal_in_write(
        self, node: str, directory: str, within: float, sig: signals.Signals, act: str | None = None
    ) -> dict:
        """Signal the first worker of `node` that opens a file under `directory` for writing, at once."""
        watched = self.cluster.exec(
            node,
            *nodescripts.argv(nodescripts.KILL_IN_WRITE, directory, within, int(sig), act=act),
            timeout=within + 15,
        )
        if watched.exit_code == nodescripts.NEVER_CAME:
            raise FaultError(f"{node}: {_last(watched.stderr)}")
        if not watched.ok:
            raise FaultError(f"{node}: watching for a checkpoint write failed: {_last(watched.stderr)}")
        return nodescripts.parse_result(node, "write watcher", watched.stdout)

    def freeze_during_checkpoint(
        self, target: str = "rank0", *, directory: str = SHARED_CKPT_DIR, within: float = 60.0
    ) -> dict:
        """Freeze a node in the middle of a checkpoint write (sim/core/faultkinds/checkpoint.py)."""
        options = checkpoint.InWriteOptions(target, directory, within)
        return self.carry_out(checkpoint.FREEZE_DURING_CHECKPOINT, options)

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

    def _signal(self, node: str, pid: int, sig: signals.Signals) -> None:
        # As the container's own user, the one the agent and workers run as: root would need CAP_KILL to
        # signal them, and the nodes drop every capability.
        result = self.cluster.exec(node, "kill", f"-{sig.name.removeprefix('SIG')}", str(pid))
        if not result.ok:
            raise FaultError(f"{node}: kill -{sig.name} {pid} failed: {_last(result.stderr)}")

    def _node_of_rank(self, rank: int) -> str:
        for info in self.cluster.nodes():
            if info.state == "running" and self.processes(info.node).worker(rank=rank):
                return info.node
        raise FaultError(f"rank {rank}: no running worker has it now (the world may be smaller, or restarting)")
