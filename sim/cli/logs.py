"""Following a running job in the terminal until it ends.

The compact view reads the run's history as the collector writes it and prints what a
person follows: progress, rendezvous rounds, restarts, failures and faults, one line each
(FollowView, a pure record -> line mapping). `--verbose` prints the raw container logs.
Both stop once every node container has exited: etcd's log never ends by itself.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple, TextIO

from sim.core.history import (
    FILE_NAME,
    AgentRecord,
    DockerRecord,
    FaultRecord,
    History,
    HistoryTail,
    Record,
    RunRecord,
    TrainerRecord,
    WorkerRecord,
)
from sim.core.wait import Check, wait_for
from sim.engines.cluster import Cluster, ContainerInfo, JobFinished
from sim.verdict.checkers import Stuck, cannot_finish
from sim.verdict.runmodel import RunModel

COMPACT_EVERY = 10  # the shipped trainer's progress: rank 0, every tenth step
NODE_LINE_INTERVAL_S = 5.0  # instrumented workers' records: at most a line per node this often
QUIET_S = 2.0  # after the job: the collector appends the nodes' last lines within this
# Progress sources, poorest first: once a richer one is seen, the poorer ones only repeat it.
PROGRESS_SOURCES = (("worker", "activity"), ("worker", "step"), ("worker", "progress"), ("trainer", "progress"))
RDZV_ERROR_WORDS = {
    "rdzv_closed": "rendezvous closed",
    "rdzv_timeout": "rendezvous timed out",
    "rdzv_error": "rendezvous error",
    "rdzv_close_failed": "closing the rendezvous failed",
}
DOCKER_WORDS = {
    "start": "container started",
    "pause": "container paused (frozen)",
    "unpause": "container unpaused",
    "oom": "container ran out of memory (OOM kill)",
}


class FollowView:
    """Turns history records into the compact follow view's lines, or None for a record
    not worth a line. Holds only what compaction needs (no I/O), so tests feed it records."""

    def __init__(
        self, t0: float | None = None, *, every: int = COMPACT_EVERY, interval_s: float = NODE_LINE_INTERVAL_S
    ):
        self.t0 = t0  # None: the first record's time (the run's start record)
        self.every = every
        self.interval_s = interval_s
        self._richest = -1
        self._shown: dict[str, tuple[float, object]] = {}  # node -> (time, restart) of its last worker line
        self._round: dict[str, tuple[object, object]] = {}  # node -> (world size, restart count) of its rendezvous

    def line(self, record: Record) -> str | None:
        t = record.t
        if self.t0 is None:
            self.t0 = t
        handler = self._HANDLERS.get(type(record))
        text = handler(self, record) if handler else None
        if text is None:
            return None
        return f"{t - self.t0:7.1f}s  {getattr(record, 'node', None) or '':<6} {text}"

    def _progress_source_ok(self, record: Record, event: str) -> bool:
        """False for a record whose source is poorer than one already seen."""
        source = (record.TYPE, event)
        if source not in PROGRESS_SOURCES:
            return True
        rank = PROGRESS_SOURCES.index(source)
        self._richest = max(self._richest, rank)
        return rank == self._richest

    def _trainer(self, r: TrainerRecord) -> str | None:
        kind = r.kind
        rank0 = r.rank == 0
        if kind == "progress":
            if not self._progress_source_ok(r, "progress") or not rank0 or (r.step or 0) % self.every:
                return None
            return f"step {r.step}{_loss(r)}{_world(r)}"
        if kind == "start" and rank0:
            resumed = r.resumed_from
            return (f"trainer resumed from step {resumed}" if resumed else "trainer started from scratch") + _world(r)
        if kind == "summary" and rank0:
            return f"trainer finished at step {r.final_step} after {r.elapsed or 0:.1f}s"
        if kind == "warning":
            return f"warning (rank {r.rank}): {r.message}"
        return None

    def _worker(self, r: WorkerRecord) -> str | None:
        event = r.event
        if event == "exit":
            code = r.code
            return None if code in (0, None) else f"worker rank {r.rank} exited with code {code}"
        if event not in ("step", "activity", "progress") or not self._progress_source_ok(r, event):
            return None
        node, t, restart = r.node or "", r.t, r.restart
        last = self._shown.get(node)
        if last is not None and last[1] == restart and t - last[0] < self.interval_s:
            return None
        self._shown[node] = (t, restart)
        who = f"rank {r.rank} " if r.rank is not None else ""
        if event == "step":
            what = f"step {r.step}" if r.step is not None else f"optimizer step {r.n} of this process"
        elif event == "activity":
            what = f"{r.collectives} collective calls (last {r.op})"
        else:
            what = f"step {r.step}{_loss(r)}"
        return f"{who}{what}{_world(r)}"

    def _agent(self, r: AgentRecord) -> str | None:
        event, node = r.event, r.node or ""
        if event == "rdzv_joined":
            return f"joined rendezvous round {r.round} as node {r.group_rank} of {r.nodes}"
        if event == "rdzv_complete":
            # Printed with the group_started line that follows it at once.
            self._round[node] = (r.global_world_size, r.restart_count)
            return None
        if event == "group_started":
            world, restarts = self._round.pop(node, (None, None))
            return "worker group started" + (f": world {world}, restart {restarts}" if world is not None else "")
        if event == "group_failed":
            left, most = r.attempts_left, r.max_restarts
            if left:
                return f"worker group failed: restarting ({left}/{most} attempts left)"
            return f"worker group failed: no restarts left (--max-restarts {most})"
        if event == "worker_failed":
            return f"worker local_rank {r.local_rank} (pid {r.pid}) {_exit_words(r.exitcode)}"
        if event == "group_finished":
            return "worker group finished"
        if event == "new_nodes":
            return f"{r.count} new node(s) waiting: the group will regroup"
        if event == "keepalive_failed":
            return f"keep-alive failed: {_clip(r.message, 160)}"
        if event in RDZV_ERROR_WORDS:
            return f"{RDZV_ERROR_WORDS[event]}: {_clip(r.message, 200)}"
        if event == "error_file":
            return f"root cause: {_clip(r.message, 300)}"
        if event in ("worker_error", "exception"):
            return f"error: {_clip(r.message, 300)}"
        if event == "worker_exception" and r.frame:  # a traceback through the user's own code
            exception = f"{r.name}: {r.message}" if r.message else str(r.name)
            return f"error: {_clip(exception, 200)} at {r.frame}"
        if event == "agent_signal":
            return f"agent received signal {r.signal}"
        return None

    def _docker(self, r: DockerRecord) -> str | None:
        if r.action == "die":
            return f"container exited with code {r.exit_code}"
        return DOCKER_WORDS.get(r.action)

    def _fault(self, r: FaultRecord) -> str | None:
        target = f" on {r.target}" if r.target else ""
        head = f"fault {r.fault}{target}"
        phase = r.phase
        if phase == "invoke":
            args = " ".join(f"{k}={v}" for k, v in (r.args or {}).items() if v is not None)
            return f"{head}: invoked{' (' + args + ')' if args else ''}"
        if phase == "ok":
            return f"{head}: done"
        if phase == "fail":
            return f"{head}: failed: {r.error}"
        if phase == "info":
            return f"{head}: outcome unknown: {r.error}"
        return None

    def _run(self, r: RunRecord) -> str | None:
        if r.event == "engine_lost":
            return f"the Docker engine stopped answering; nothing more was recorded ({r.why})"
        return "run ended: the cluster was removed" if r.event == "end" else None

    # One handler per record type, named here (not built from the type's name).
    _HANDLERS: dict[type[Record], Callable[[FollowView, Record], str | None]] = {
        TrainerRecord: _trainer,
        WorkerRecord: _worker,
        AgentRecord: _agent,
        DockerRecord: _docker,
        FaultRecord: _fault,
        RunRecord: _run,
    }


def _world(r: TrainerRecord | WorkerRecord) -> str:
    parts = [
        f"world {r.world_size}" if r.world_size is not None else "",
        f"restart {r.restart}" if r.restart is not None else "",
    ]
    text = " ".join(p for p in parts if p)
    return f" ({text})" if text else ""


def _loss(r: TrainerRecord | WorkerRecord) -> str:
    loss = r.loss
    return f" loss {loss:.4f}" if isinstance(loss, (int, float)) else ""


def _exit_words(code: object) -> str:
    """torch reports a worker killed by a signal as a negative exit code."""
    if isinstance(code, int) and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"failed with exit code {code}"


def _clip(text: object, width: int) -> str:
    text = " ".join(str(text or "").split())
    return text if len(text) <= width else text[: width - 3] + "..."


def live_run(history: Iterable[Record]) -> tuple[str, str] | None:
    """(cluster, run id) of a run whose history has no end record yet (`down` writes one)."""
    start = None
    for record in history:
        if isinstance(record, RunRecord) and record.event == "end":
            return None
        if isinstance(record, RunRecord) and record.event == "start" and start is None:
            start = record
    return (start.cluster, start.run_id) if start and start.cluster and start.run_id else None


def nodes_up(containers: Sequence[ContainerInfo], run_id: str) -> tuple[int, int]:
    """(node containers of this run still up, all its node containers); paused counts as up."""
    nodes = [c for c in containers if c.role == "node" and c.run_id == run_id]
    return sum(c.state in ("running", "paused", "restarting") for c in nodes), len(nodes)


class FollowEnd(NamedTuple):
    """How following a job ended: in words, and, for a job that cannot finish, why (its nodes still run)."""

    text: str
    stuck: Stuck | None = None


def follow_job(
    cluster: Cluster,
    out: TextIO = sys.stdout,
    *,
    verbose: bool = False,
    poll_s: float = 1.0,
    quiet_s: float = QUIET_S,
    hang_s: float | None = None,
) -> FollowEnd:
    """Print the job as it runs until every node container has exited, or (with `hang_s`) until it cannot
    finish: an agent gave up and the rest made no progress for hang_s with no fault in force
    (sim.verdict.checkers.cannot_finish). Returns how it ended."""
    raw = _print_raw_logs(cluster, out) if verbose else None
    tail = HistoryTail(cluster.run_dir / FILE_NAME)
    view = FollowView()
    stuck = _CannotFinish(cluster, hang_s) if hang_s is not None else None

    def show_new() -> bool:
        records = tail.poll()
        if not verbose:
            for line in filter(None, map(view.line, records)):
                print(line, file=out, flush=True)
        return bool(records)

    try:
        ended = wait_for(
            _Showing(JobFinished(cluster), show_new, stuck), timeout=None, interval=poll_s, raise_errors=False
        )
        # The nodes' last lines (summary, root cause) reach the history just after they exit.
        wait_for(_Quiet(show_new, quiet_s), timeout=5 * quiet_s, interval=min(poll_s, quiet_s / 4), raise_errors=False)
    finally:
        if raw is not None:
            raw.terminate()
            raw.wait()
    if ended.failure:
        return FollowEnd(f"stopped following: {ended.failure} (the cluster was removed)")
    if stuck is not None and stuck.found is not None:
        return FollowEnd("stopped following: the job cannot finish (its nodes still run)", stuck.found)
    exits = ", ".join(f"{c.node} {c.exit_code if c.exit_code is not None else c.status}" for c in cluster.nodes())
    return FollowEnd(f"job ended: every node container exited (exit codes: {exits})")


class _CannotFinish:
    """Whether the job can no longer finish (sim.verdict.checkers.cannot_finish), asked of the whole history at most
    every `every_s`, and only once a node has exited non-zero while another still runs (the premise: an agent gave
    up): a job that trains costs no history read."""

    def __init__(self, cluster: Cluster, hang_s: float, every_s: float = 5.0):
        self.cluster, self.hang_s, self.every_s = cluster, hang_s, every_s
        self.next_check = 0.0
        self.found: Stuck | None = None

    def check(self) -> bool:
        now = time.monotonic()
        if now < self.next_check:
            return False
        self.next_check = now + self.every_s
        nodes = self.cluster.nodes()
        if not any(c.state in ("exited", "dead") and c.exit_code not in (0, None) for c in nodes):
            return False
        if all(c.state in ("exited", "dead") for c in nodes):
            return False  # the job ended: JobFinished says so
        contents = History(self.cluster.run_dir / FILE_NAME).read()
        self.found = cannot_finish(RunModel(contents.records), time.time(), self.hang_s)
        return self.found is not None


class _Showing:
    """A strategy that first shows what is new, then asks the one it wraps (and, if given, whether the job
    cannot finish: then it is ready too)."""

    def __init__(self, inner: JobFinished, show_new: Callable[[], bool], stuck: _CannotFinish | None = None):
        self.inner, self.show_new, self.stuck = inner, show_new, stuck
        self.description = inner.description

    def check(self) -> Check:
        self.show_new()
        if self.stuck is not None and self.stuck.check():
            return Check(True, detail="the job cannot finish")
        return self.inner.check()


class _Quiet:
    """Ready once nothing new was shown for `quiet_s` seconds."""

    description = "waiting for the history to settle"

    def __init__(self, show_new: Callable[[], bool], quiet_s: float):
        self.show_new, self.quiet_s = show_new, quiet_s
        self.quiet_since = time.monotonic()

    def check(self) -> Check:
        if self.show_new():
            self.quiet_since = time.monotonic()
        return Check(time.monotonic() - self.quiet_since >= self.quiet_s)


def _print_raw_logs(cluster: Cluster, out: TextIO) -> subprocess.Popen:
    """`docker compose logs -f` of every container, copied to `out` from a thread."""
    proc = cluster.docker.compose_process(cluster.project, cluster.compose_file, "logs", "-f", capture=True)
    spec = cluster.spec
    redact = spec.redact if spec is not None and spec.secret_values() else str

    def copy() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            print(redact(line.rstrip("\n")), file=out, flush=True)

    threading.Thread(target=copy, daemon=True).start()
    return proc
