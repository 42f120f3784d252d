"""The job's own pitfalls, read from what the instrumentation records of its checkpoints.

Pure functions of the run model (registered among sim/verdict/diagnose.py's DIAGNOSES, first: they are the
most fundamental causes). The node image's instrumentation (images/node/elastic_sim_instrument.py)
writes a "save" record per torch.save / DCP save to a named file (its path; the first one also
describes the saved object: `content`), and a "load" record with the last file a worker loaded
before its first step.
- node-local checkpoint: a save outside the storage every node shares (the cluster's /ckpt);
- ranks resumed from different points: in one group, some ranks loaded a checkpoint and some did
  not, or they loaded different files;
- state missing from the checkpoint: the first save holds a model's state but no optimizer's.
"""

from __future__ import annotations

import dataclasses
import posixpath
from datetime import datetime, timezone

from sim.core.history import WorkerRecord
from sim.core.nodes import node_order
from sim.verdict.runmodel import RunModel

# The storage every node of a sim cluster shares (the checkpoint volume); with a writable --mount of one host
# folder into every node, that too (_shared_dirs). A save anywhere else is node-local.
SHARED_DIRS = ("/ckpt",)


@dataclasses.dataclass(frozen=True)
class Finding:
    """A pitfall as the diagnoses word it (sim/verdict/diagnose.py turns it into a Diagnosis)."""

    code: str
    title: str
    cause: str
    evidence: tuple[str, ...]
    fix: str


def _at(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%H:%M:%S") + f".{int(t * 10) % 10}"


def _who(r: WorkerRecord) -> str:
    return f"{r.node} {_at(r.t)}  rank {r.rank}"


def _saves(run: RunModel) -> list[WorkerRecord]:
    return [r for r in run.records if isinstance(r, WorkerRecord) and r.event == "save" and r.path]


def is_shared(path: str, shared: tuple[str, ...] = SHARED_DIRS) -> bool:
    path = posixpath.normpath(path)
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in shared)


def _shared_dirs(run: RunModel) -> tuple[str, ...]:
    """/ckpt, and the node paths of the run's writable mounts (one host folder seen by every node)."""
    mounts = run.spec_fields.mounts or ()
    writable = [str(m[1]) for m in mounts if isinstance(m, (list, tuple)) and len(m) == 3 and m[2] is True]
    return (*SHARED_DIRS, *writable)


def node_local_checkpoint(run: RunModel) -> Finding | None:
    """A checkpoint written outside storage every node shares, in a job of more than one node: a node that joins
    or replaces another finds none (or an old one of its own) and starts from another point than the others."""
    shared = _shared_dirs(run)
    local = [r for r in _saves(run) if not is_shared(r.path, shared)]
    if not local or len({r.node for r in run.starts} | {r.node for r in local}) < 2:
        return None
    first: dict[str, WorkerRecord] = {}
    for r in local:
        first.setdefault(r.node, r)
    evidence = [f"{_who(r)} saved {r.path} (on its own node's disk)" for _, r in sorted(first.items(), key=_node)]
    return Finding(
        "node-local-checkpoint",
        "Checkpoint on node-local storage",
        f"the script saves its checkpoint to {local[0].path}, which is on each node's own disk, not on storage every "
        "node shares: a node that joins, or replaces a lost one, has no checkpoint (or an old one) and resumes from "
        "another point than the others",
        tuple(evidence),
        "save the checkpoint where every node reads the same file: /ckpt in a sim cluster (a shared filesystem or "
        "object store in production), e.g. torch.save(state, os.path.join(os.environ.get('CKPT_DIR', '/ckpt'), "
        "'snapshot.pt')), and load it from there",
    )


def _node(item: tuple[str, WorkerRecord]):
    return node_order(item[0])


def resume_sources(run: RunModel, begin: float = float("-inf"), end: float = float("inf")) -> list[dict]:
    """Per group started in (begin, end), each rank's source: the file it loaded before its first step, or None
    (started afresh). A worker's loads are matched to its start by node and process."""
    loads = [r for r in run.records if isinstance(r, WorkerRecord) and r.event == "load"]
    groups = []
    for index, cohort in enumerate(run.cohorts):
        if not begin < cohort.t < end:
            continue
        until = run.cohorts[index + 1].t if index + 1 < len(run.cohorts) else float("inf")  # a pid is reused later
        ranks = []
        for start in cohort.starts:
            if not isinstance(start, WorkerRecord) or start.rank is None:
                continue
            mine = [r for r in loads if r.node == start.node and r.pid == start.pid and start.t <= r.t < until]
            ranks.append((start, mine[-1].path if mine else None))
        groups.append({"t": cohort.t, "ranks": ranks})
    return groups


def mixed_sources(group: dict) -> bool:
    sources = {path for _, path in group["ranks"]}
    return len(sources) > 1 and any(sources)


def source_words(start: WorkerRecord, path: str | None) -> str:
    return f"{_who(start)} {'loaded ' + path if path else 'loaded nothing: it started afresh'}"


def resumed_apart(run: RunModel) -> Finding | None:
    """Ranks of one group resumed from different points: one loaded nothing while others loaded a checkpoint, or
    they loaded different files. Training goes on, out of step: the replicas differ (DDP broadcasts rank 0's
    weights only at construction) and the job ends out of step."""
    mixed = [g for g in resume_sources(run) if mixed_sources(g)]
    if not mixed:
        return None
    group = mixed[0]
    ranks = sorted(group["ranks"], key=lambda item: item[0].rank)
    fresh = [s.rank for s, path in ranks if not path]
    return Finding(
        "resumed-apart",
        "Ranks resumed from different points",
        f"in the group started at {_at(group['t'])} the ranks did not resume from the same checkpoint"
        + (f": rank(s) {', '.join(map(str, fresh))} found none and started afresh" if fresh else "")
        + "; they train on from different states and steps",
        tuple(source_words(start, path) for start, path in ranks),
        "every rank must load the same checkpoint: keep it on storage every node shares (/ckpt), or have rank 0 "
        "load it and broadcast the state (and the step) to the others before training",
    )


def missing_state(run: RunModel) -> Finding | None:
    """The first save holds a model's state but no optimizer's, while the script steps an optimizer: a resume
    restarts the optimizer from scratch on trained weights (momentum, Adam's moments and step count lost)."""
    described = [r for r in _saves(run) if r.content is not None]
    if not described:
        return None
    first = described[0]
    content = first.content
    stepping = any(isinstance(r, WorkerRecord) and r.event == "step" for r in run.records)
    if not (content.model_state and not content.optimizer_state and stepping):
        return None
    keys = content.keys or {}
    shown = ", ".join(f"{k}: {v}" for k, v in list(keys.items())[:8]) or content.type or "?"
    return Finding(
        "missing-optimizer-state",
        "Checkpoint without optimizer state",
        "the checkpoint holds the model's state but not the optimizer's, while the script steps an optimizer: "
        "after a resume the optimizer starts from scratch on trained weights, and the loss may jump",
        (f"{_who(first)} first save {first.path}: {{{shown}}}",),
        "save the optimizer's state beside the model's and load both on resume: "
        "torch.save({'model': model.state_dict(), 'optimizer': optimizer.state_dict(), ...}, path) and "
        "optimizer.load_state_dict(checkpoint['optimizer']) (and a scheduler's or AMP scaler's, if the script has one)",
    )


PITFALLS = (node_local_checkpoint, resumed_apart, missing_state)
# Their codes: a job's own pitfall explains a failed fault wherever its evidence is (the first save, say).
PITFALL_CODES = ("node-local-checkpoint", "resumed-apart", "missing-optimizer-state")
