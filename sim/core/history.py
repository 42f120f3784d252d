"""The run's history: one append-only JSONL file, one clock (wall time), typed records.

Like Jepsen's history, it is data: every fault is an operation recorded as `invoke` then
`ok`/`fail`/`info`; the trainer, the torchrun agents, Docker and the workers' instrumentation add
their events. Checkers read it; nothing rewrites it.

Every line is one record of six types (run, fault, docker, agent, trainer, worker): a frozen
class each, built by the one parser, `parse_record`. Typed fields are attributes; keys the schema
does not name stay readable in `extra` (a newer writer's fields). A record is not a mapping: its
readers use its fields (`record.node`), and `to_dict()` gives the line as written.
The run start record carries the schema version; a history without one is version 1.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import json
import os
import stat
import threading
import time
import types
import typing
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import ClassVar

from sim.core.errors import HistoryError, HistoryWriteError

FILE_NAME = "history.jsonl"
SCHEMA_VERSION = 1
# Bounds no real record comes near: a corrupt or hostile line beyond them is skipped, so no checker
# meets a step of 10**400 (overflow) or a world size of 10**30 (a range it would build).
MAX_WHOLE_NUMBER = 10**12
MAX_TIME = 1e11  # unix seconds (the year 5138): a clock further ahead is broken
FAULT_PHASES = ("invoke", "ok", "fail", "info")
# Records that must survive a crash of the machine, not only of the process: fsynced when written.
DURABLE_TYPES = ("run", "fault")
# What the node image's instrumentation writes through the side channel (sim/core/sidechannel.py).
# "imported" (torch imported), "pg_ready" (init_process_group returned) and "load" (checkpoint
# loads so far) time a start's way to its first step; histories before them lack them. "save" is one
# checkpoint written to a named file (torch.save, torch.distributed.checkpoint's save) by any script.
# Device emulation (images/node/elastic_sim_devices.py): "emulated" (what: devices, per_node, failure_timing),
# "emulated_group" (failure_timing: the timing in force for the default process group, "gloo" where the
# script asked for gloo), "emulated_calls" (calls: the emulated calls this process made so far, with
# counts) and "nccl_watchdog" (a collective whose peer was gone, held `seconds` from `began` until the
# process group's timeout, then aborted).
DEVICE_EVENTS = ("emulated", "emulated_group", "emulated_calls", "nccl_watchdog")
WORKER_EVENTS = (
    *("start", "step", "activity", "progress", "exit", "imported", "pg_ready", "load", "save"),
    *("uses", "sampler", "params"),  # the job's pitfalls (sim/verdict/pitfalls.py)
    *DEVICE_EVENTS,
)


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class _Nested:
    """A JSON object inside a record, typed: its fields where the value has the schema's type; the keys
    this schema does not name, and a value of another type (its reader sees None), stay in `extra`.
    `to_dict()` is the object as written."""

    extra: Mapping = dataclasses.field(default_factory=dict, repr=False)
    as_written: Mapping = dataclasses.field(default_factory=dict, repr=False)

    @classmethod
    def parse(cls, data: Mapping | None):
        """The one way the object becomes typed (a record's parser calls it)."""
        if isinstance(data, cls):
            return data
        data = dict(data or {})
        values, extra, derived = {}, {}, cls._derived(data)
        for name, value in data.items():
            if name in derived:
                continue
            kinds = _field_kinds(cls).get(name)
            if kinds is None or name in ("extra", "as_written"):
                extra[name] = value
                continue
            typed = _typed(value, kinds[0])
            if typed is _WRONG_TYPE:
                extra[name] = value
            elif typed is not None:
                values[name] = typed
        return cls(**values, **derived, extra=extra, as_written=data)

    @classmethod
    def _derived(cls, data: Mapping) -> dict:
        """Fields read from the object as a whole, not one key each."""
        return {}

    def to_dict(self) -> dict:
        return dict(self.as_written)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _Nested):
            return type(self) is type(other) and self.to_dict() == other.to_dict()
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class FaultResult(_Nested):
    """What a fault operation did, as its `ok` record says: the fields every kind's result has. Each kind's
    typed result (sim.core.faultkinds, `FaultKind.read_result`) adds its own fields; here they stay readable in
    `extra` and `to_dict()`. A kind's result built by its writer (not parsed) is written as its fields: node
    and id where set, its own fields always."""

    node: str | None = None  # the node it acted on (a role such as "random" resolved)
    id: str | None = None  # a fault in force: the id `sim faults` and `sim heal` use
    as_written: Mapping | None = dataclasses.field(default=None, repr=False)  # None: built by its writer

    def to_dict(self) -> dict:
        if self.as_written is not None:
            return dict(self.as_written)
        data = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name in ("extra", "as_written") or (field.name in ("node", "id") and value is None):
                continue
            data[field.name] = list(value) if isinstance(value, tuple) else value
        return {**data, **self.extra}


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class SavedContent(_Nested):
    """What a worker's first saved object held at its top level (the node image's saved_content)."""

    type: str | None = None  # its class name
    keys: dict | None = None  # key -> the class name of its value
    model_state: bool | None = None  # a model's state (a mapping of tensors) is in it
    optimizer_state: bool | None = None  # an optimizer's (state and param_groups)
    scheduler_state: bool | None = None  # an LR scheduler's (None: an instrumentation that did not look)
    scaler_state: bool | None = None  # an AMP GradScaler's


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class RecordedSpec(_Nested):
    """The cluster's spec as the run start record gives it (sim.core.spec.ClusterSpec's fields). A history
    written before a field existed lacks it: None."""

    nodes: int | None = None
    min_nodes: int | None = None
    max_nodes: int | None = None
    nproc_per_node: int | None = None
    max_restarts: int | None = None
    rdzv_backend: str | None = None
    rdzv_conf: tuple | None = None  # (key, value) pairs
    env: tuple | None = None  # (key, value) pairs
    mounts: tuple | None = None  # (host, container, writable)
    devices: str | None = None
    failure_timing: str | None = None
    instrument: bool | None = None
    script: str | None = None  # the user's script on the host; None: the shipped trainer (or a history before it)
    progress_regex: str | None = None  # --progress-regex
    memory: str | None = None  # --memory as given ("none": lifted); None: the default
    memory_limit: int | None = None  # bytes each node got; None: no limit (or a history before bounds)
    pids: int | None = None

    @property
    def pairs(self) -> dict[str, dict]:
        """rdzv_conf and env as dicts (a pair that is not a pair is passed over)."""
        return {
            name: {str(p[0]): p[1] for p in (getattr(self, name) or ()) if isinstance(p, (list, tuple)) and len(p) == 2}
            for name in ("rdzv_conf", "env")
        }


_WRONG_TYPE = object()


def _typed(value: object, accepted: tuple[type, ...]) -> object:
    """`value` as one of the accepted types (a JSON list as a tuple), None for None, else _WRONG_TYPE."""
    if value is None:
        return None
    if tuple in accepted and isinstance(value, list):
        value = tuple(value)
    if isinstance(value, bool) and bool not in accepted:
        return _WRONG_TYPE
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_WHOLE_NUMBER:
        return _WRONG_TYPE
    return value if isinstance(value, accepted) else _WRONG_TYPE


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class Record:
    """One history line, typed: read its fields by name (`record.node`); `to_dict()` is the line as
    written. Two records are equal when their lines are."""

    TYPE: ClassVar[str] = ""
    t: float
    extra: Mapping = dataclasses.field(default_factory=dict, repr=False)  # keys this schema does not name

    @classmethod
    @functools.cache
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls) if f.name != "extra")

    def to_dict(self) -> dict:
        """The record as its JSON line holds it: "t", "type", each field that has a value, the extra keys."""
        data = {"t": self.t, "type": self.TYPE}
        for name in self.field_names()[1:]:
            value = getattr(self, name)
            if isinstance(value, _Nested):
                data[name] = value.to_dict()
            elif value is not None:
                data[name] = list(value) if isinstance(value, tuple) else value
        data.update(self.extra)
        return data

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Record):
            return self.to_dict() == other.to_dict()
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable-looking equality: records are not set members


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class RunRecord(Record):
    """The run itself: "start" (what ran), "scenario" (a chaos run's plan), "step_not_fired", "engine_lost"
    (the collector found the Docker engine gone: `why`), "records_lost" (the collector could not write `lost`
    records, stamped `lost_from` to `lost_to`: the history's disk was full), "end"."""

    TYPE: ClassVar[str] = "run"
    event: str
    schema: int | None = None  # start only: the history's schema version
    cluster: str | None = None
    run_id: str | None = None
    spec: RecordedSpec | None = None  # ClusterSpec's fields, as the start record gives them
    profile: str | None = None
    target_steps: int | None = None
    ckpt_interval: int | None = None
    scenario: str | None = None
    backend: str | None = None
    seed: int | None = None
    expected: str | None = None
    checkers: tuple[str, ...] | None = None
    why: str | None = None
    lost: int | None = None  # records_lost
    lost_from: float | None = None
    lost_to: float | None = None

    @property
    def spec_fields(self) -> RecordedSpec:
        """The spec it records; an empty one (every field None) where it records none."""
        return self.spec or RecordedSpec()


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class FaultRecord(Record):
    """One phase of a fault operation (sim/faults/nemesis.py's invoke)."""

    TYPE: ClassVar[str] = "fault"
    op: str
    fault: str
    phase: str  # FAULT_PHASES
    target: str | None = None
    args: dict | None = None  # invoke
    result: FaultResult | None = None  # ok
    error: str | None = None  # fail, info

    @property
    def outcome(self) -> FaultResult:
        """What it did (an empty result for an invoke, fail or info record)."""
        return self.result or FaultResult()

    @property
    def node(self) -> str | None:
        """The node the fault resolved its target to ("random" -> node1), where it says."""
        return self.outcome.node

    @property
    def where(self) -> str | None:
        """The node it acted on, else its target."""
        return self.node or self.target


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class DockerRecord(Record):
    TYPE: ClassVar[str] = "docker"
    action: str  # create, start, die, kill, stop, pause, unpause, oom, destroy, network_connect, ...
    node: str | None = None
    exit_code: int | None = None
    signal: str | None = None


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class AgentRecord(Record):
    """What a torchrun agent said in its log (sim/core/agentlog.py names the events)."""

    TYPE: ClassVar[str] = "agent"
    event: str
    node: str | None = None
    round: int | None = None
    group_rank: int | None = None
    nodes: int | None = None
    restart_count: int | None = None
    group_world_size: int | None = None
    global_world_size: int | None = None
    master_addr: str | None = None
    attempts_left: int | None = None
    max_restarts: int | None = None
    local_rank: int | None = None
    exitcode: int | None = None
    pid: int | None = None
    count: int | None = None
    kind: str | None = None
    name: str | None = None
    message: str | None = None
    signal: int | None = None
    frame: str | None = None  # worker_exception: the last frame in the user's own files, "path:line in func"
    source: str | None = None  # worker_exception: that frame's source line, as the traceback printed it

    def restarts_used(self, max_restarts: int | None = None) -> int | None:
        """For a "group_failed" ("Worker group FAILED. k/m attempts left"): the restarts this agent
        has used once it acts on it. With k > 0 it restarts (number m-k+1); at 0 it gives up, m used.
        `max_restarts` stands in where the line gave no m."""
        most = self.max_restarts if self.max_restarts is not None else max_restarts
        if self.event != "group_failed" or self.attempts_left is None or most is None:
            return None
        return most - self.attempts_left + 1 if self.attempts_left > 0 else most


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class _WorkerFacts(Record):
    """What trainer lines and instrumentation records share: who wrote it."""

    node: str | None = None
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    restart: int | None = None  # TORCHELASTIC_RESTART_COUNT
    pid: int | None = None
    run_id: str | None = None
    step: int | None = None
    loss: float | None = None


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class TrainerRecord(_WorkerFacts):
    """A JSON line of the shipped trainer (trainer/train.py)."""

    TYPE: ClassVar[str] = "trainer"
    kind: str  # start, progress, checkpoint, summary, warning
    epoch: int | None = None
    resumed_from: int | None = None
    ckpt_world_size: int | None = None
    backend: str | None = None
    path: str | None = None
    final_step: int | None = None
    elapsed: float | None = None
    steps_run_this_start: int | None = None
    message: str | None = None
    # start: when `import torch` finished, the process group was ready and the checkpoint load began
    # (wall clock; the start line ends the load)
    t_imported: float | None = None
    t_pg_ready: float | None = None
    t_ckpt_began: float | None = None


@dataclasses.dataclass(frozen=True, eq=False, kw_only=True)
class WorkerRecord(_WorkerFacts):
    """The node image's instrumentation, through the side channel (sim/core/sidechannel.py)."""

    TYPE: ClassVar[str] = "worker"
    event: str  # WORKER_EVENTS
    n: int | None = None  # step: optimizer steps this process took
    collectives: int | None = None
    op: str | None = None
    source: str | None = None  # progress: "api" | "log" (a log line: no rank)
    code: int | None = None  # exit
    seconds: float | None = None  # pg_ready: the init call's duration; load: all loads' so far; save: its own
    path: str | None = None  # load: the last file loaded; save: the file (or DCP directory) written
    # save: when it began (the record's time is when it returned); nccl_watchdog: when the collective began
    began: float | None = None
    devices: str | None = None  # emulated: "emulated"
    per_node: int | None = None  # emulated: devices per node
    failure_timing: str | None = None  # emulated, emulated_group: "nccl" | "gloo"
    calls: dict | None = None  # emulated_calls: call name -> count, this process so far
    # nccl_watchdog: the process group's timeout; pg_ready: the timeout= the script gave init_process_group
    # (None: it gave none, torch's default is in force)
    timeout_s: float | None = None
    content: SavedContent | None = None  # save (the first of a process): what the saved object held
    what: str | None = None  # uses: "lr_scheduler" | "grad_scaler"
    cls: str | None = None  # uses: the class constructed
    sampler: int | None = None  # sampler: which DistributedSampler of the process
    epoch: int | None = None  # sampler: its epoch then
    iterations: int | None = None  # sampler: its iterations so far
    shuffle: bool | None = None  # sampler: whether it shuffles
    fingerprint: str | None = None  # params: the parameters' sum after the first step (repr of a float64)
    numel: int | None = None  # params: how many parameter elements it summed


RECORD_TYPES: dict[str, type[Record]] = {
    kind.TYPE: kind for kind in (RunRecord, FaultRecord, DockerRecord, AgentRecord, TrainerRecord, WorkerRecord)
}


def parse_record(data: Mapping | Record) -> Record:
    """The one way a history line becomes a record; HistoryError when it does not follow the schema."""
    if isinstance(data, Record):
        return data
    if not isinstance(data, Mapping):
        raise HistoryError(f"history line {str(data)[:80]!r}: not a JSON object; write one object per line")
    kind = RECORD_TYPES.get(data.get("type"))  # type: ignore[arg-type]
    if kind is None:
        raise HistoryError(
            f"history record {_brief(data)}: unknown type {data.get('type')!r}; use one of {', '.join(RECORD_TYPES)}"
        )
    values: dict = {"extra": {k: v for k, v in data.items() if k != "type" and k not in kind.field_names()}}
    for name, (accepted, required) in _field_kinds(kind).items():
        value = data.get(name)
        if value is None:
            if required:
                raise HistoryError(f"history record {_brief(data)}: no {name!r}; every {kind.TYPE} record needs one")
            continue
        nested = next((a for a in accepted if isinstance(a, type) and issubclass(a, _Nested)), None)
        if nested is not None:
            if isinstance(value, (Mapping, nested)):
                values[name] = nested.parse(value)
            else:  # not an object: kept as written, unread (the record still counts)
                values["extra"][name] = value
            continue
        if tuple in accepted and isinstance(value, list):
            value = tuple(value)
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_WHOLE_NUMBER:
            raise HistoryError(
                f"history record {_brief(data)}: {name} is a {value.bit_length()}-bit number, beyond any real value"
            )
        if not isinstance(value, accepted) or (isinstance(value, bool) and bool not in accepted):
            raise HistoryError(
                f"history record {_brief(data)}: {name} {value!r} is not "
                f"{' or '.join(a.__name__ for a in accepted)}; "
                "write it as the schema in sim/core/history.py says"
            )
        values[name] = value
    if not 0 <= values["t"] <= MAX_TIME:  # NaN fails too
        raise HistoryError(f"history record {_brief(data)}: time {values['t']!r} is not a wall-clock time")
    if kind is FaultRecord and values["phase"] not in FAULT_PHASES:
        raise HistoryError(
            f"history record {_brief(data)}: phase {values['phase']!r}; use one of {', '.join(FAULT_PHASES)}"
        )
    if kind is WorkerRecord and values["event"] not in WORKER_EVENTS:
        raise HistoryError(
            f"history record {_brief(data)}: worker event {values['event']!r}; use one of {', '.join(WORKER_EVENTS)}"
        )
    if kind is RunRecord and values["event"] == "start":
        values.setdefault("schema", SCHEMA_VERSION)  # written before the version existed: version 1
    return kind(**values)


def as_records(history: Iterable[Mapping | Record]) -> list[Record]:
    """Records as given, dicts (a hand-written history) parsed."""
    return [parse_record(r) for r in history]


@functools.cache
def _field_kinds(kind: type) -> dict[str, tuple[tuple[type, ...], bool]]:
    """Field name -> (accepted Python types, required), from the class's annotations."""
    hints = typing.get_type_hints(kind)
    kinds = {}
    for field in dataclasses.fields(kind):
        if field.name == "extra":
            continue
        hint = hints[field.name]
        args = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
        accepted = tuple(typing.get_origin(a) or a for a in args if a is not type(None))
        if float in accepted:
            accepted += (int,)  # JSON writes 2.0 as 2
        required = field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
        kinds[field.name] = (accepted, required)
    return kinds


def _brief(data: Mapping) -> str:
    return f"{data.get('type')!r} at t={data.get('t')!r}"


def _parse_line(line: bytes | str) -> Record | None:
    """A line's record; None for a blank line; HistoryError for a line that is not a record."""
    if not line.strip():
        return None
    try:
        data = json.loads(line)
    except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nested thousands deep
        raise HistoryError(f"history line {line[:80]!r}: not JSON (a torn write?)") from None
    return parse_record(data)


@dataclasses.dataclass(frozen=True)
class HistoryContents:
    records: tuple[Record, ...]  # in file order
    skipped_lines: int  # lines that were not a record (a torn write, the half-written last line of a live run)


class History:
    def __init__(self, path: Path):
        self.path = Path(path)
        self._lock = threading.Lock()

    def append(self, record: Mapping | Record) -> Record:
        """Write one record (a dict or a Record), stamped with the time now unless it has one.
        It goes through the parser first: an off-schema record raises HistoryError, unwritten."""
        data = {"t": time.time(), **(record.to_dict() if isinstance(record, Record) else record)}
        if data.get("type") == "run" and data.get("event") == "start":
            data.setdefault("schema", SCHEMA_VERSION)
        parsed = parse_record(data)
        line = (json.dumps(data, sort_keys=False, default=str) + "\n").encode()
        with self._lock:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                # O_APPEND and one lock for every writer (the collector, CLI calls): lines never interleave.
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)  # its start record holds --env
            except OSError as error:
                raise HistoryWriteError(f"{self.path}: record not written ({error.strerror or error})") from None
            try:
                _append_whole(fd, line, durable=parsed.TYPE in DURABLE_TYPES)
            except OSError as error:
                raise HistoryWriteError(f"{self.path}: record not written ({error.strerror or error})") from None
            finally:
                os.close(fd)
        return parsed

    def read(self) -> HistoryContents:
        """Every whole record, and how many lines were not one: the checkers judge what was recorded."""
        if not self.path.exists():
            return HistoryContents((), 0)
        records, skipped = [], 0
        for line in self.path.read_text(errors="replace").splitlines():
            try:
                record = _parse_line(line)
            except HistoryError:
                skipped += 1
                continue
            if record is not None:
                records.append(record)
        return HistoryContents(tuple(records), skipped)

    def records(self) -> Iterator[Record]:
        return iter(self.read().records)


def _append_whole(fd: int, line: bytes, *, durable: bool) -> None:
    """Append the whole line or nothing. A short write (a full disk) is written on until done or an error;
    on an error the file is cut back to where the line began, so no torn line swallows the next record.
    A torn last line left by a crash gets its end first: this record starts on a line of its own."""
    fcntl.flock(fd, fcntl.LOCK_EX)  # released with the fd
    info = os.fstat(fd)
    regular = stat.S_ISREG(info.st_mode)  # not /dev/null or a pipe: those have no end to mend, nor sync
    start = info.st_size if regular else 0
    if start and os.pread(fd, 1, start - 1) != b"\n":
        line = b"\n" + line
    try:
        done = 0
        while done < len(line):
            done += os.write(fd, line[done:])  # a short count without an error: the rest goes on next
        if durable and regular:
            os.fsync(fd)
    except OSError:
        if regular:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
        raise


class HistoryTail:
    """Reads only what was appended since the last poll (the file grows by many
    lines a second during training; re-reading it whole would not scale)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._offset = 0
        self._partial = b""
        self.skipped_lines = 0  # whole lines that were not a record

    def poll(self) -> list[Record]:
        if not self.path.exists():
            return []
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            data = f.read()
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()  # an unfinished last line waits for the next poll
        records = []
        for line in lines:
            try:
                record = _parse_line(line)
            except HistoryError:
                self.skipped_lines += 1
                continue
            if record is not None:
                records.append(record)
        return records
