"""What every diagnosis shares: the Diagnosis itself and its evidence lines (a record or a log line, with its
node and time), and the run's facts several topics read.

The topic modules build on it; registry.py's DIAGNOSES orders them."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable
from datetime import datetime, timezone

from sim.core.faultkinds import FaultKind, kind_of
from sim.core.history import AgentRecord, DockerRecord, FaultRecord, FaultResult, Record
from sim.core.nodes import node_order
from sim.verdict.runmodel import RunModel

MAX_EVIDENCE = 8


# No sign of training for this long while a node is frozen: the others are stuck in a collective.
FROZEN_HANG_S = 60.0


NODE_LOSS_DOCKER = ("die", "kill", "stop", "pause", "network_disconnect")


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    code: str  # stable short name, e.g. "shared-tcp-store"
    title: str
    cause: str
    evidence: tuple[str, ...]  # "node0 14:09:46.8  <line or record>"; the first MAX_EVIDENCE of those given
    fix: str

    def __post_init__(self):
        object.__setattr__(self, "evidence", tuple(self.evidence)[:MAX_EVIDENCE])


def _agent_nodes(run: RunModel) -> list[str]:
    return sorted({r.node for r in run.agent if r.node}, key=node_order)


def _faults_where(run: RunModel, trait: Callable[[FaultKind], bool]) -> list[FaultRecord]:
    """The faults done (their ok records) of every kind with a trait (sim.core.faultkinds), e.g.
    _faults_where(run, lambda kind: kind.loses_node)."""
    return [r for r in run.records if isinstance(r, FaultRecord) and r.phase == "ok" and trait(kind_of(r.fault))]


def result_of(fault: FaultRecord) -> FaultResult:
    """What a fault's ok record says it did, typed as its kind's result (a fill's `written`, a skew's `by`)."""
    return kind_of(fault.fault).read_result(fault.result)


def _at(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%H:%M:%S") + f".{int(t * 10) % 10}"


def _line(record: Record, text: str | None = None) -> str:
    who = (record.where if isinstance(record, FaultRecord) else record.node) or "?"
    return f"{who} {_at(record.t)}  {text if text is not None else _describe(record)}"


def _describe(r: Record) -> str:
    if isinstance(r, FaultRecord):
        return f"fault {r.fault} on {r.target} ({r.phase})"
    if isinstance(r, DockerRecord):
        code = f" (exit code {r.exit_code})" if r.exit_code is not None else ""
        return f"container {r.action}{code}"
    if not isinstance(r, AgentRecord):
        return str(getattr(r, "event", None) or getattr(r, "kind", None) or r.TYPE)
    if r.event == "group_failed":
        return f"Worker group FAILED. {r.attempts_left}/{r.max_restarts} attempts left"
    if r.event == "worker_failed":
        return f"worker local_rank {r.local_rank} (pid {r.pid}) failed, exitcode {r.exitcode}"
    if r.event == "rdzv_joining":
        return "agent entered the rendezvous"
    if r.event == "error_file":
        return _root_cause(r.message or "")
    if r.event in ("exception", "worker_exception"):
        return f"{r.name}: {r.message}"
    return _tidy(r.message) if r.message else r.event


# What makes torch's lines long without telling anything: the glog or logging prefix, the rank
# prefix, and C++ source locations.
_NOISE = re.compile(
    r"^\[?[IWEF]\d{4}[ -][^\]]*\]\s*|^\[rank\d+\]:\s*|\[/[^\]]*\]\s*"
    r"|\btorch(\.\w+)+\.(?=\w+(Error|Exception)\b)"
)


def _tidy(message: str) -> str:
    return _NOISE.sub("", message).strip()


def _root_cause(message: str) -> str:
    """torchrun's root-cause block (" | "-joined lines) as rank, exit code and the error itself."""
    parts = [p.strip() for p in message.split(" | ")]
    fields = dict(re.match(r"(\w+)\s*:\s*(.*)", p).groups() for p in parts if re.match(r"\w+\s*:", p))
    error = next((p for p in reversed(parts) if re.search(r"(Error|Exception|Signal \d+)", p)), "")
    return _tidy(
        f"root cause: rank {fields.get('rank', '?')}, exitcode {fields.get('exitcode', '?')}"
        + (f": {error.removeprefix('traceback : ')}" if error else "")
    )


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _first_per_node(records: Iterable[Record]) -> list[Record]:
    seen, first = set(), []
    for r in records:
        if r.node not in seen:
            seen.add(r.node)
            first.append(r)
    return first


def _frozen_node(pause: FaultRecord | DockerRecord) -> str | None:
    return pause.target if isinstance(pause, FaultRecord) else pause.node


def unexplained(run: RunModel) -> Diagnosis:
    """No rule's premise holds for a failed run: no known cause is named, and what each node's history said last is
    shown instead (as many records per node as the evidence holds), for a person to read."""
    by_node: dict[str, list[Record]] = {}
    for record in run.records:
        if isinstance(record, FaultRecord) and record.phase == "invoke":
            continue  # an intent, named by its role ("rank0"): its outcome names the node
        node = record.where if isinstance(record, FaultRecord) else getattr(record, "node", None)
        if isinstance(node, str):
            by_node.setdefault(node, []).append(record)
    nodes = sorted(by_node, key=node_order)
    per_node = max(1, MAX_EVIDENCE // max(len(nodes), 1))
    return Diagnosis(
        "unexplained",
        "No known cause: each node's last records",
        "The verdict failed, and no known cause's premise holds in this run's history and logs (each rule stays "
        "silent when what it explains did not happen). What each node did last is below.",
        [_line(r) for node in nodes for r in by_node[node][-per_node:]],
        "Read the nodes' logs around these records (`python -m sim logs NAME`, or the run folder's logs/); if the "
        "cause is one torch or the job shows often, it is worth a diagnosis of its own.",
    )
