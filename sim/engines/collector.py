"""The history collector: one background process per running cluster.

It follows the cluster's Docker events, every node's log (through restarts
and scale-ups) and the workers' side channel (sim/core/sidechannel.py: the run
folder's events/*.jsonl) and appends what they say to the run's history, live,
so `sim status --watch` and the checkers read one ordered record of the run.
Started by `sim up`, it ends by itself once the cluster's containers are gone.

    python -m sim.engines.collector CLUSTER
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Callable

from sim.core import labels
from sim.core.agentlog import NodeLogParser, parse_docker_timestamp
from sim.core.errors import DockerUnavailableError, HistoryError, HistoryWriteError, SimError
from sim.core.history import FILE_NAME, DockerRecord, History, Record, RunRecord, parse_record
from sim.core.sidechannel import EVENTS_DIR, EventsTail, ProgressMatcher
from sim.core.wait import Check, wait_for
from sim.engines.cluster import Cluster
from sim.engines.docker import Docker, EventStream
from sim.engines.engine import choose_engine

STARTUP_GRACE_S = 600
GONE_FOR_S = 4  # every container gone this long: the cluster is down
# The engine unanswering this long: stopped (its containers with it), not a slow answer under load.
ENGINE_LOST_S = 10
LIVENESS_POLL_S = 2.0
# Actions worth a history line; exec_* events (our own probes) are noise.
CONTAINER_ACTIONS = {"create", "start", "die", "kill", "stop", "pause", "unpause", "oom", "destroy", "restart"}
NETWORK_ACTIONS = {"connect", "disconnect"}
EVENTS_POLL_S = 0.25


class Collector:
    def __init__(self, cluster: Cluster, history: History):
        self.cluster = cluster
        self.history = history
        self._followers: dict[str, threading.Thread] = {}
        self._last_t: dict[str, float] = {}  # per container: newest log line already recorded
        self._nodes: dict[str, str] = {}  # container id -> node name
        self._lock = threading.Lock()
        self.stop = threading.Event()
        self.events = EventsTail(cluster.run_dir / EVENTS_DIR)
        self.progress = _progress_matcher(cluster)
        self.redact = _redactor(cluster)  # --env values out of the lines the history keeps
        self.lost = _Lost()  # records the history could not take (its disk full), said once space is back

    def run(self) -> None:
        events = self.cluster.docker.events(self.cluster.label_filter)
        threading.Thread(target=self._read_events, args=(events,), daemon=True).start()
        tail_done = threading.Event()
        tail = threading.Thread(target=self._tail_side_channel, args=(tail_done,), daemon=True)
        tail.start()
        for info in self.cluster.containers():
            self._nodes[info.id] = info.node
            if info.state in ("running", "paused"):
                self._follow(info.id)
        gone = _ClusterGone(self.cluster, self.stop)
        wait_for(gone, timeout=None, interval=LIVENESS_POLL_S, sleep=self.stop.wait)
        if gone.engine_lost is not None:
            self._append(
                RunRecord(t=gone.engine_lost_at, event="engine_lost", cluster=self.cluster.name, why=gone.engine_lost)
            )
            print(f"collector: {gone.engine_lost}; stopped following cluster '{self.cluster.name}'", file=sys.stderr)
        events.close()
        for thread in list(self._followers.values()):
            thread.join(timeout=5)
        tail_done.set()
        tail.join(timeout=5)
        self._say_lost()  # space may have come back since the last record

    def _append(self, record: Record) -> None:
        """Append a record; one the history cannot take (its disk full) is counted, not fatal: the collector
        goes on, and the next record that can be written follows a "records_lost" record saying how many
        were lost, and when."""
        if not self._say_lost():
            self.lost.add(record)
            return
        try:
            self.history.append(record)
        except HistoryWriteError:
            self.lost.add(record)
        except HistoryError as error:  # off the schema: a bug, or a crafted line; the others go on
            _say(f"collector: record dropped: {error}")

    def _append_line(self, line: dict) -> None:
        """A record the side channel or the progress regex read as a line (checked against the schema there),
        typed here: stamped with the time now where the worker gave none."""
        try:
            record = parse_record({"t": time.time(), **line})
        except HistoryError as error:
            _say(f"collector: record dropped: {error}")
            return
        self._append(record)

    def _say_lost(self) -> bool:
        """Write the pending "records_lost" record, if any; False while the history still takes nothing."""
        pending = self.lost.take()
        if pending is None:
            return True
        try:
            self.history.append(pending)
        except HistoryWriteError:
            self.lost.put_back(pending)
            return False
        _say(f"collector: {pending.lost} records lost (the history could not be written)")
        return True

    def _read_events(self, events: EventStream) -> None:
        try:
            for event in events:
                record = self._docker_record(event)
                if record is None:
                    continue
                self._append(record)
                if event.get("Type") == "container" and record.action == "start":
                    self._follow(event.get("id") or event["Actor"]["ID"])
        except (OSError, SimError):
            pass  # the engine went (requests' errors are OSErrors): the liveness check records it

    def _docker_record(self, event: dict) -> DockerRecord | None:
        kind, action = event.get("Type"), event.get("Action", "")
        attrs = (event.get("Actor") or {}).get("Attributes") or {}
        t = event.get("timeNano", 0) / 1e9 or float(event.get("time", time.time()))
        if attrs.get(labels.ROLE) == labels.NETNS_HELPER:
            return None  # a network fault's helper (Cluster.net_exec): not one of the cluster's containers
        if kind == "container" and action in CONTAINER_ACTIONS:
            cid = event.get("id") or event["Actor"]["ID"]
            node = attrs.get(labels.NODE) or self._nodes.get(cid) or attrs.get("name", "?")
            self._nodes.setdefault(cid, node)
            exit_code = int(attrs["exitCode"]) if "exitCode" in attrs else None
            return DockerRecord(t=t, node=node, action=action, exit_code=exit_code, signal=attrs.get("signal"))
        if kind == "network" and action in NETWORK_ACTIONS:
            node = self._nodes.get(attrs.get("container", ""), attrs.get("container", "?")[:12])
            return DockerRecord(t=t, node=node, action=f"network_{action}")
        return None

    def _tail_side_channel(self, done: threading.Event) -> None:
        """Worker records, polled until `done`, then once more: the workers are gone by then."""
        while True:
            finished = done.wait(EVENTS_POLL_S)
            try:
                for line in self.events.poll():
                    self._append_line(line)
            except Exception as error:  # noqa: BLE001 - one bad poll must not end the side channel for good
                _say(f"collector: side channel: {type(error).__name__}: {error}")
            if finished:
                return

    def _follow(self, cid: str) -> None:
        with self._lock:
            running = self._followers.get(cid)
            if running is not None and running.is_alive():
                return
            thread = threading.Thread(target=self._read_logs, args=(cid,), daemon=True)
            self._followers[cid] = thread
            thread.start()

    def _read_logs(self, cid: str) -> None:
        node = self._nodes.get(cid, cid[:12])
        since = self._last_t.get(cid)
        parser = NodeLogParser(node)
        try:
            for line in self.cluster.docker.follow_logs(cid, since=since):
                self._record_line(cid, node, since, parser, line)
        except (OSError, SimError):
            pass  # the container is gone, or the engine (requests' errors are OSErrors): its log ended with it
        for record in parser.close():
            self._append(record)

    def _record_line(self, cid: str, node: str, since: float | None, parser: NodeLogParser, line: str) -> None:
        t, body = parse_docker_timestamp(line)
        if t is not None and since is not None and t <= since:
            return  # already recorded before the container restarted
        if t is not None:
            self._last_t[cid] = t
        body = self.redact(body)
        for record in parser.feed(t, body):
            self._append(record)
        if self.progress is not None:
            progress = self.progress.match(node, t, body)
            if progress is not None:
                self._append_line(progress)


class _Lost:
    """Records the history could not take: how many, and the span of their times (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count, self._first, self._last = 0, 0.0, 0.0

    def add(self, record: Record) -> None:
        self._merge(1, record.t, record.t)

    def take(self) -> RunRecord | None:
        """The "records_lost" record of what is pending, and nothing pending after; None if nothing is."""
        with self._lock:
            if not self._count:
                return None
            record = RunRecord(
                t=time.time(), event="records_lost", lost=self._count, lost_from=self._first, lost_to=self._last
            )
            self._count = 0
            return record

    def put_back(self, record: RunRecord) -> None:
        self._merge(record.lost or 0, record.lost_from or record.t, record.lost_to or record.t)

    def _merge(self, count: int, first: float, last: float) -> None:
        with self._lock:
            if self._count:
                first, last = min(first, self._first), max(last, self._last)
            self._count += count
            self._first, self._last = first, last


class _ClusterGone:
    """Ready once the cluster's containers are gone (`down`) for a few seconds, or never came
    (the collector starts before `compose up`), or the engine stopped answering (its streams, which
    the collector follows, ended with it; `engine_lost` says why), or the collector was told to stop."""

    description = "following the cluster until it is removed"

    def __init__(self, cluster: Cluster, stop: threading.Event):
        self.cluster, self.stop = cluster, stop
        self.started = time.monotonic()
        self.seen = False
        self.gone_since: float | None = None
        self.unreachable_since: float | None = None
        self.engine_lost: str | None = None
        self.engine_lost_at = 0.0  # Unix time of the first unanswered check

    def check(self) -> Check:
        if self.stop.is_set():
            return Check(True, detail="told to stop")
        now = time.monotonic()
        try:
            containers = self.cluster.containers()
        except DockerUnavailableError as error:
            if self.unreachable_since is None:
                self.unreachable_since, self.engine_lost_at = now, time.time()
            if now - self.unreachable_since < ENGINE_LOST_S:
                return Check(False, detail=str(error))
            self.engine_lost = str(error)
            return Check(True, detail="the Docker engine stopped answering")
        self.unreachable_since = None
        if containers:
            self.seen, self.gone_since = True, None
            return Check(False)
        if not self.seen:
            return Check(now - self.started > STARTUP_GRACE_S, detail="no container ever came")
        self.gone_since = self.gone_since or now
        return Check(now - self.gone_since > GONE_FOR_S, detail="every container is gone")


def _say(line: str) -> None:
    """A line to the collector's log, which sits on the state disk: a full one must not end a thread."""
    with contextlib.suppress(OSError):
        print(line, file=sys.stderr, flush=True)


def _redactor(cluster: Cluster) -> Callable[[str], str]:
    """The run's ClusterSpec.redact (identity for a spec that cannot be read, or with nothing to hide)."""
    try:
        spec = cluster.spec
    except (SimError, ValueError, TypeError, OSError):
        spec = None
    if spec is None or not spec.secret_values():
        return lambda text: text
    return spec.redact


def _progress_matcher(cluster: Cluster) -> ProgressMatcher | None:
    """The run's --progress-regex, if it has one (a spec that cannot be read has none)."""
    try:
        spec = cluster.spec
    except (SimError, ValueError, TypeError, OSError):
        return None
    return ProgressMatcher(spec.progress_regex) if spec is not None and spec.progress_regex else None


def main(argv: list[str]) -> int:
    # A Swarm cluster's provider follows every host's engine: events and logs of its tasks (sim/engines/swarm.py).
    cluster = choose_engine(Docker(), name=argv[0]).cluster(argv[0])
    collector = Collector(cluster, History(cluster.run_dir / FILE_NAME))
    signal.signal(signal.SIGTERM, lambda *_: collector.stop.set())
    # Started with these blocked (sim.engines.cluster.Cluster._start_collector holds Ctrl-C until it has our pid).
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    collector.run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
