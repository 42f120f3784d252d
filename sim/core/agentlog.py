"""A node's log -> history records (sim/core/history.py's typed TrainerRecord and AgentRecord): the
trainer's JSON lines and the torchrun agent's own INFO lines. Pure functions of text, unit-tested
on captured lines.

The agent prints some facts over several lines (the "Rendezvous complete ...
Result:" block), so parsing is a small state machine per node: NodeLogParser.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Iterator
from datetime import datetime, timezone

from sim.core.errors import HistoryError
from sim.core.history import AgentRecord, Record, TrainerRecord, parse_record

# torch/distributed/elastic/rendezvous/dynamic_rendezvous.py (etcd-v2, c10d); needs the
# node image's rendezvous log hook (images/node/elastic_sim_rdzv_log.py).
JOINED_ROUND = re.compile(r"has joined round (\d+) of the rendezvous '([^']*)' as rank (\d+) in a world of size (\d+)")
KEEPALIVE_FAILED = re.compile(r"failed to send a keep-alive heartbeat")
# The agent's closing call (shutdown closes the rendezvous) failed: its message names the error type
# (often RendezvousTimeoutError: etcd was away for close_timeout), which is no join timeout.
CLOSE_FAILED = re.compile(r"failed to shutdown the rendezvous")
# torch/distributed/elastic/agent/server/api.py
RDZV_COMPLETE = "Rendezvous complete for workers. Result:"
GROUP_FAILED = re.compile(r"Worker group FAILED\. (\d+)/(\d+) attempts left")
NEW_NODES = re.compile(r"Detected (\d+) new nodes")
GROUP_FINISHED = "worker group successfully finished"
# Logged right after a completed rendezvous, as the agent spawns this round's workers: the
# moment training starts from torch's own point of view, whatever the script prints.
GROUP_STARTING = "] Starting worker group"
# The agent enters a rendezvous (first start, after a failure or a membership change).
RDZV_JOINING = "] Rendezvous'ing worker group"
# A spare agent (it joined when the job was full) leaves once the job closes the rendezvous.
RDZV_GRACEFUL_EXIT = re.compile(r"Rendezvous gracefully exited: (.*)")
# The agent was told to stop (SIGTERM from `docker stop`, Ctrl-C): it stops its workers and exits.
AGENT_SIGNAL = re.compile(r"Received (\d+) death signal, shutting down workers")
# torch/distributed/elastic/multiprocessing/api.py
WORKER_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\)")
# What workers print when their process group breaks (gloo, c10d, NCCL), by kind. Every worker
# and every traceback repeats it, so each kind is recorded once per node per attempt.
WORKER_ERRORS = (
    # A name inside the cluster (etcd, node0) does not resolve: first, whatever failed on it.
    (
        re.compile(
            r"Name or service not known|Temporary failure in name resolution|gai error: -[23]\b|Failed to resolve '"
        ),
        "name_resolution",
    ),
    (re.compile(r"connectFullMesh failed"), "gloo_connect"),
    (re.compile(r"Timed out waiting \d+ms|ran for \d+ milliseconds before timing out"), "timeout"),
    (re.compile(r"Connection (closed|reset) by peer"), "peer_lost"),
    (re.compile(r"DistBackendError"), "backend"),
    # ENOSPC on a checkpoint write (a worker's own, or the agent's error file).
    (re.compile(r"Errno 28\b|No space left on device"), "disk_full"),
    # torch.load on a damaged file: pickle's and torch's zip reader's own words.
    (
        re.compile(r"UnpicklingError|PytorchStreamReader failed|invalid load key|unexpected EOF"),
        "checkpoint_unreadable",
    ),
)
# A traceback frame inside torch.load: the exception line that ends such a traceback is a
# checkpoint that could not be read, whatever its words (torch 2.13 reads a truncated zip
# checkpoint as "OSError: [Errno 22] Invalid argument", an empty one as a bare "EOFError").
LOAD_FRAME = re.compile(r'torch/serialization\.py", line \d+, in _?(legacy_)?load\b')
EXCEPTION_LINE = re.compile(r"^(\[rank\d+\]:\s*)?[\w.]*(Error|Exception)\b")
# The last line of a traceback the agent itself dies with, for the exceptions a diagnosis names
# (torchrun's AttributeError in a spare agent; python-etcd's errors against an etcd without v2).
AGENT_EXCEPTION = re.compile(r"^(AttributeError|etcd\.Etcd\w+): (.*)$")
RDZV_ERRORS = (
    ("RendezvousClosedError", "rdzv_closed"),
    ("RendezvousTimeoutError", "rdzv_timeout"),
    ("RendezvousConnectionError", "rdzv_error"),
    ("RendezvousStateError", "rdzv_error"),
)
# A worker's (or the agent's) Python traceback, as the interpreter prints it to stderr (workers' stderr
# goes to the container's log): "Traceback ...", then per frame `  File "PATH", line N, in FUNC` and
# its source line (3.11's `^^^` markers under it), then the exception line "Type: message".
TRACEBACK_START = "Traceback (most recent call last):"
TRACEBACK_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>.+)$')
TRACEBACK_MARKS = re.compile(r"^\s*[\^~]+\s*$")
TRACEBACK_EXCEPTION = re.compile(r"^(?P<name>[A-Za-z_][\w.]*)(?::\s?(?P<message>.*))?$")
# The prefix torchrun's --tee / --local-ranks-filter put on each worker line, and torch's "[rankN]:".
WORKER_PREFIX = re.compile(r"^\[(?:rank|default)?\d+\]:\s?")
# Library files: a frame in none of these is the user's own code (the script's folder, /opt/sim/user, or
# a project tree brought into the node); the node image's hooks are ours.
LIBRARY_FILE = re.compile(r"/(site|dist)-packages/|/lib/python\d[\d.]*/|^<|/elastic_sim_\w+\.py$|/bin/torchrun$")
# torchrun's closing "Root Cause (first observed failure)" block (from @record error files)
ROOT_CAUSE = "Root Cause (first observed failure):"
_KV = re.compile(r"^\s+(\w+)=(.*)$")
_TS = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?Z ")


def parse_docker_timestamp(line: str) -> tuple[float | None, str]:
    """`docker logs --timestamps` prefixes each line with RFC 3339 UTC time."""
    match = _TS.match(line)
    if not match:
        return None, line
    whole = datetime.strptime(match.group(1), "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc)
    fraction = float(match.group(2) or 0)
    return whole.timestamp() + fraction, line[match.end() :]


class NodeLogParser:
    """Feed it one node's log lines in order; it yields history records."""

    def __init__(self, node: str):
        self.node = node
        self._block: dict | None = None  # an open "Rendezvous complete" block
        self._block_t = 0.0
        self._root_cause: list[str] | None = None
        self._errors_this_attempt: set[str] = set()  # worker error kinds already recorded
        self._in_load_traceback = False  # a traceback through torch.load is being printed
        self._traceback: list[dict] | None = None  # the frames of a traceback being printed

    def feed(self, t: float | None, text: str) -> Iterator[Record]:
        t = t if t is not None else 0.0
        trainer = self._trainer(t, text)
        if trainer is not None:
            yield trainer
            return
        exception = self._traceback_line(t, text)
        if exception is not None:
            yield exception
        yield from self._agent(t, text)

    def _traceback_line(self, t: float, text: str) -> AgentRecord | None:
        """Follow a Python traceback; at its exception line, a "worker_exception" record: the exception
        and its last frame in the user's own files (none: the traceback never passed through them)."""
        body = WORKER_PREFIX.sub("", text.rstrip())
        if body.strip() == TRACEBACK_START:
            self._traceback = []
            return None
        frames = self._traceback
        if frames is None or not body.strip():
            return None
        if m := TRACEBACK_FRAME.match(body):
            frames.append({"file": m["file"], "line": m["line"], "func": m["func"].strip(), "source": None})
            return None
        if body[0].isspace():
            if frames and frames[-1]["source"] is None and not TRACEBACK_MARKS.match(body):
                frames[-1]["source"] = body.strip()
            return None
        if _printed_time_prefix(body):
            return None  # an agent's log line between a worker's traceback lines
        self._traceback = None
        m = TRACEBACK_EXCEPTION.match(body)
        if not m or not frames:
            return None
        mine = [f for f in frames if is_user_file(f["file"])]
        frame = mine[-1] if mine else None
        through_load = any(LOAD_FRAME.search(f'{f["file"]}", line {f["line"]}, in {f["func"]}') for f in frames)
        return self._agent_record(
            t,
            "worker_exception",
            # the worker_error kind it is: a failed torch.load is an unreadable checkpoint, whatever its words
            kind=_worker_error_kind(body) or ("checkpoint_unreadable" if through_load else None),
            name=m["name"],
            message=(m["message"] or "").strip()[:500],
            frame=f"{frame['file']}:{frame['line']} in {frame['func']}" if frame else None,
            source=frame["source"] if frame else None,
        )

    def _trainer(self, t: float, text: str) -> TrainerRecord | None:
        """The trainer's JSON line in the text, or None: none there, or one off the history's schema."""
        start = text.find('{"sim"')
        line = _json(text[start:]) if start >= 0 else None
        if line is None:
            return None
        kind = line.pop("sim")
        try:
            record = parse_record(
                {"t": line.pop("t", t), "type": "trainer", "node": line.pop("node", self.node), "kind": kind, **line}
            )
        except HistoryError:
            return None
        return record if isinstance(record, TrainerRecord) else None

    def _agent(self, t: float, text: str) -> Iterator[AgentRecord]:
        if self._block is not None:
            kv = _KV.match(text.split("] ", 1)[-1]) if "] " in text else None
            if kv:
                self._block[kv.group(1)] = kv.group(2).strip()
                return
            yield self._close_block()
        if self._root_cause is not None:
            body = text.strip()
            if body.startswith("=") and len(self._root_cause) > 1:
                yield self._agent_record(t, "error_file", message=" | ".join(self._root_cause)[:2000])
                self._root_cause = None
            elif body and not body.startswith("="):
                self._root_cause.append(body)
            return
        if RDZV_COMPLETE in text:
            self._block, self._block_t = {}, t
            return
        if ROOT_CAUSE in text:
            self._root_cause = []
            return
        if m := JOINED_ROUND.search(text):
            yield self._agent_record(
                t, "rdzv_joined", round=int(m.group(1)), group_rank=int(m.group(3)), nodes=int(m.group(4))
            )
        elif m := GROUP_FAILED.search(text):
            yield self._agent_record(t, "group_failed", attempts_left=int(m.group(1)), max_restarts=int(m.group(2)))
        elif m := NEW_NODES.search(text):
            yield self._agent_record(t, "new_nodes", count=int(m.group(1)))
        elif m := WORKER_FAILED.search(text):
            yield self._agent_record(
                t, "worker_failed", exitcode=int(m.group(1)), local_rank=int(m.group(2)), pid=int(m.group(3))
            )
        elif GROUP_FINISHED in text:
            yield self._agent_record(t, "group_finished")
        elif GROUP_STARTING in text:
            self._errors_this_attempt.clear()
            self._in_load_traceback = False
            yield self._agent_record(t, "group_started")
        elif RDZV_JOINING in text:
            yield self._agent_record(t, "rdzv_joining")
        elif m := RDZV_GRACEFUL_EXIT.search(text):
            yield self._agent_record(t, "rdzv_graceful_exit", message=m.group(1).strip()[-300:])
        elif KEEPALIVE_FAILED.search(text):
            yield self._agent_record(t, "keepalive_failed", message=text.strip()[-300:])
        elif CLOSE_FAILED.search(text):
            yield self._agent_record(t, "rdzv_close_failed", message=text.strip()[-300:])
        elif m := AGENT_SIGNAL.search(text):
            yield self._agent_record(t, "agent_signal", signal=int(m.group(1)))
        elif LOAD_FRAME.search(text):
            self._in_load_traceback = True
        elif (kind := self._worker_error_kind(text)) is not None:
            if kind not in self._errors_this_attempt:
                self._errors_this_attempt.add(kind)
                yield self._agent_record(t, "worker_error", kind=kind, message=text.strip()[-300:])
        elif m := AGENT_EXCEPTION.match(text.strip()):
            yield self._agent_record(t, "exception", name=m.group(1), message=m.group(2)[-300:])
        else:
            for marker, event in RDZV_ERRORS:
                if marker in text and not text.lstrip().startswith(("File ", "raise ", "^")):
                    yield self._agent_record(t, event, message=text.strip()[-300:])
                    break

    def _worker_error_kind(self, text: str) -> str | None:
        kind = _worker_error_kind(text)
        if self._in_load_traceback and EXCEPTION_LINE.match(text.strip()):
            self._in_load_traceback = False
            return kind or "checkpoint_unreadable"
        return kind

    def close(self) -> Iterator[AgentRecord]:
        if self._block is not None:
            yield self._close_block()

    def _close_block(self) -> AgentRecord:
        block, self._block = self._block or {}, None
        return self._agent_record(
            self._block_t,
            "rdzv_complete",
            restart_count=_int(block.get("restart_count")),
            group_rank=_int(block.get("group_rank")),
            group_world_size=_int(block.get("group_world_size")),
            global_world_size=_first_int(block.get("global_world_sizes")),
            master_addr=block.get("master_addr"),
        )

    def _agent_record(self, t: float, event: str, **fields) -> AgentRecord:
        return AgentRecord(t=t, node=self.node, event=event, **fields)


def parse_node_log(node: str, text: str) -> list[Record]:
    """A whole node log (as saved on disk) -> its agent and trainer records.
    A line without a `docker logs` timestamp
    takes the time torch printed in it (month, day and time of day; the year is unknown, so such
    times only order lines and show the time of day); a line with neither (a worker's own output,
    a traceback) the time of the next line that has one, as the agent reports a worker's error
    right after it, else of the last one."""
    lines = [parse_docker_timestamp(line) for line in text.splitlines()]
    times = [t if t is not None else _printed_time(body) for t, body in lines]
    following = None
    for index in reversed(range(len(times))):
        if times[index] is None:
            times[index] = following
        following = times[index]
    previous = 0.0
    for index, t in enumerate(times):  # lines after the last timed one
        if t is None:
            times[index] = previous
        previous = times[index]
    parser, records = NodeLogParser(node), []
    for t, (_, body) in zip(times, lines, strict=True):
        records.extend(parser.feed(t, body))
    records.extend(parser.close())
    return records


# glog ("I1130 14:05:21.251000", "[E1130 14:09:46.849360398"), and the rendezvous hook's
# logging format ("I2026-11-30 14:05:21,251").
_PRINTED_TIME = (
    re.compile(r"^\[?[IWEF](?P<mo>\d\d)(?P<d>\d\d) (?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)\.(?P<f>\d{1,6})"),
    re.compile(r"^[IWEF]\d{4}-(?P<mo>\d\d)-(?P<d>\d\d) (?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d),(?P<f>\d{1,6})"),
)


_YEAR_UNKNOWN = 2000  # a leap year, so that 29 February parses


def _printed_time(text: str) -> float | None:
    for pattern in _PRINTED_TIME:
        m = pattern.match(text)
        if m:
            try:
                stamp = datetime(
                    _YEAR_UNKNOWN,
                    int(m["mo"]),
                    int(m["d"]),
                    int(m["h"]),
                    int(m["mi"]),
                    int(m["s"]),
                    tzinfo=timezone.utc,
                )
            except ValueError:
                return None
            return stamp.timestamp() + float("0." + m["f"])
    return None


@dataclasses.dataclass
class NodeLogFacts:
    round: int | None = None
    group_rank: int | None = None
    nodes_in_round: int | None = None
    world_size: int | None = None  # trainers, from the newest progress line
    restarts: int = 0
    step: int | None = None
    finished: bool = False


def node_facts(records: Iterable[Record]) -> NodeLogFacts:
    """The latest state of one node, from its history records (in time order)."""
    facts = NodeLogFacts()
    for r in records:
        if isinstance(r, AgentRecord):
            if r.event == "rdzv_joined":
                facts.round, facts.group_rank, facts.nodes_in_round = r.round, r.group_rank, r.nodes
            elif (used := r.restarts_used()) is not None:
                facts.restarts = max(facts.restarts, used)
        elif isinstance(r, TrainerRecord):
            if r.kind == "progress":
                facts.step = r.step if r.step is not None else facts.step
                facts.world_size = r.world_size if r.world_size is not None else facts.world_size
                facts.restarts = max(facts.restarts, r.restart or 0)
            elif r.kind == "summary":
                facts.finished = True
    return facts


def node_log_facts(text: str, node: str = "node") -> NodeLogFacts:
    return node_facts(parse_node_log(node, text))


def is_user_file(path: str) -> bool:
    """Whether a traceback's file is the user's own code: not the Python library, an installed package
    (torch, site-packages), the node image's hooks or torchrun."""
    return not LIBRARY_FILE.search(path)


_GLOG_PREFIX = re.compile(r"^\[?[IWEF]\d{4}[ -]\d\d")


def _printed_time_prefix(text: str) -> bool:
    return bool(_GLOG_PREFIX.match(text))


def worker_error_kind(text: str) -> str | None:
    """The kind of process-group (or checkpoint-file) error a worker's line is, as "worker_error" records
    name it; None for any other line."""
    return _worker_error_kind(text)


def _worker_error_kind(text: str) -> str | None:
    if text.lstrip().startswith(("File ", "raise ", "^", "frame #")):
        return None
    return next((kind for pattern, kind in WORKER_ERRORS if pattern.search(text)), None)


def _json(text: str) -> dict | None:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _first_int(value: str | None) -> int | None:
    match = re.search(r"-?\d+", value or "")
    return int(match.group()) if match else None
