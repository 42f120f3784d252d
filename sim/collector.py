"""The history collector: one background process per running cluster.

It follows the cluster's Docker events, every node's log (through restarts
and scale-ups) and the workers' side channel (sim/sidechannel.py: the run
folder's events/*.jsonl) and appends what they say to the run's history, live,
so `sim status --watch` and the checkers read one ordered record of the run.
Started by `sim up`, it ends by itself once the cluster's containers are gone.

    python -m sim.collector CLUSTER
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from . import labels
from .agentlog import NodeLogParser, parse_docker_timestamp
from .cluster import Cluster
from .docker import Docker
from .errors import SimError
from .history import FILE_NAME, History
from .sidechannel import EVENTS_DIR, EventsTail, ProgressMatcher

PID_FILE = "collector.pid"
STARTUP_GRACE_S = 600
# Actions worth a history line; exec_* events (our own probes) are noise.
CONTAINER_ACTIONS = {"create", "start", "die", "kill", "stop", "pause", "unpause", "oom", "destroy", "restart"}
NETWORK_ACTIONS = {"connect", "disconnect"}
EVENTS_POLL_S = 0.25


class Collector:
    def __init__(self, cluster: Cluster, history: History):
        self.cluster = cluster
        self.history = history
        self.docker_bin = cluster.docker.docker_bin
        self._followers: dict[str, threading.Thread] = {}
        self._last_t: dict[str, float] = {}  # per container: newest log line already recorded
        self._nodes: dict[str, str] = {}  # container id -> node name
        self._lock = threading.Lock()
        self.stop = threading.Event()
        self.events = EventsTail(cluster.run_dir / EVENTS_DIR)
        self.progress = _progress_matcher(cluster)

    def run(self) -> None:
        events = subprocess.Popen(
            [self.docker_bin, "events", "--filter", labels.cluster_filter(self.cluster.name), "--format", "{{json .}}"],
            stdout=subprocess.PIPE, text=True, errors="replace")
        threading.Thread(target=self._read_events, args=(events,), daemon=True).start()
        tail_done = threading.Event()
        tail = threading.Thread(target=self._tail_side_channel, args=(tail_done,), daemon=True)
        tail.start()
        for info in self.cluster.containers():
            self._nodes[info.id] = info.node
            if info.state in ("running", "paused"):
                self._follow(info.id)
        # Started before `docker compose up`: wait for the containers to appear,
        # then run until they are all gone (down) for a few seconds.
        started, seen, gone_since = time.monotonic(), False, None
        while not self.stop.wait(2.0):
            if self.cluster.containers():
                seen, gone_since = True, None
            elif not seen:
                if time.monotonic() - started > STARTUP_GRACE_S:
                    break
            elif gone_since is None:
                gone_since = time.monotonic()
            elif time.monotonic() - gone_since > 4:
                break
        events.terminate()
        for thread in list(self._followers.values()):
            thread.join(timeout=5)
        tail_done.set()
        tail.join(timeout=5)

    def _read_events(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            record = self._docker_record(event)
            if record is None:
                continue
            self.history.append(record)
            if event.get("Type") == "container" and record["action"] == "start":
                self._follow(event.get("id") or event["Actor"]["ID"])

    def _docker_record(self, event: dict) -> dict | None:
        kind, action = event.get("Type"), event.get("Action", "")
        attrs = (event.get("Actor") or {}).get("Attributes") or {}
        t = event.get("timeNano", 0) / 1e9 or float(event.get("time", time.time()))
        if kind == "container" and action in CONTAINER_ACTIONS:
            cid = event.get("id") or event["Actor"]["ID"]
            node = attrs.get(labels.NODE) or self._nodes.get(cid) or attrs.get("name", "?")
            self._nodes.setdefault(cid, node)
            record = {"t": t, "type": "docker", "node": node, "action": action}
            if "exitCode" in attrs:
                record["exit_code"] = int(attrs["exitCode"])
            if "signal" in attrs:
                record["signal"] = attrs["signal"]
            return record
        if kind == "network" and action in NETWORK_ACTIONS:
            node = self._nodes.get(attrs.get("container", ""), attrs.get("container", "?")[:12])
            return {"t": t, "type": "docker", "node": node, "action": f"network_{action}"}
        return None

    def _tail_side_channel(self, done: threading.Event) -> None:
        """Worker records, polled until `done`, then once more: the workers are gone by then."""
        while True:
            finished = done.wait(EVENTS_POLL_S)
            for record in self.events.poll():
                self.history.append(record)
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
        argv = [self.docker_bin, "logs", "--follow", "--timestamps"]
        if since is not None:
            argv += ["--since", f"{since:.6f}"]
        proc = subprocess.Popen([*argv, cid], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace")
        parser = NodeLogParser(node)
        assert proc.stdout is not None
        for line in proc.stdout:
            t, body = parse_docker_timestamp(line.rstrip("\n"))
            if t is not None and since is not None and t <= since:
                continue  # already recorded before the container restarted
            if t is not None:
                self._last_t[cid] = t
            for record in parser.feed(t, body):
                self.history.append(record)
            if self.progress is not None:
                progress = self.progress.match(node, t, body)
                if progress is not None:
                    self.history.append(progress)
        for record in parser.close():
            self.history.append(record)
        proc.wait()


def _progress_matcher(cluster: Cluster) -> ProgressMatcher | None:
    """The run's --progress-regex, if it has one (a spec that cannot be read has none)."""
    try:
        spec = cluster.spec
    except (SimError, ValueError, TypeError, OSError):
        return None
    return ProgressMatcher(spec.progress_regex) if spec is not None and spec.progress_regex else None


def pid_file(cluster: Cluster) -> Path:
    return cluster.state_dir / PID_FILE


def start_collector(cluster: Cluster) -> int:
    """Spawn the collector for a cluster, detached from this process's session."""
    log = open(cluster.run_dir / "collector.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "sim.collector", cluster.name], stdin=subprocess.DEVNULL,
                            stdout=log, stderr=log, start_new_session=True, env=os.environ.copy())
    pid_file(cluster).write_text(str(proc.pid))
    return proc.pid


def stop_collector(cluster: Cluster, timeout: float = 10.0) -> None:
    """Let the collector drain (it exits once the containers are gone), then make sure."""
    path = pid_file(cluster)
    if not path.exists():
        return
    pid = int(path.read_text().strip() or 0)
    deadline = time.monotonic() + timeout
    while pid and _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if pid and _alive(pid):
        os.kill(pid, signal.SIGTERM)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A finished child of ours that nobody reaped is a zombie: not alive.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def main(argv: list[str]) -> int:
    cluster = Cluster(argv[0], Docker())
    collector = Collector(cluster, History(cluster.run_dir / FILE_NAME))
    signal.signal(signal.SIGTERM, lambda *_: collector.stop.set())
    collector.run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
