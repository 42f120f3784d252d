"""The job's own pitfalls, read from what the instrumentation records of its checkpoints.

Pure functions of the run model (registered among sim/verdict/diagnoses/registry.py's DIAGNOSES, first: they are the
most fundamental causes). The node image's instrumentation (images/node/elastic_sim_instrument.py)
writes a "save" record per torch.save / DCP save to a named file (its path; the first one also
describes the saved object: `content`), and a "load" record with the last file a worker loaded
before its first step.
- node-local checkpoint: a save outside the storage every node shares (the cluster's /ckpt);
- ranks resumed from different points: in one group, some ranks loaded a checkpoint and some did
  not, or they loaded different files;
- state missing from the checkpoint: the first save holds a model's state but no optimizer's, or no LR
  scheduler's or AMP scaler's while the script constructed one (a "uses" record);
- DistributedSampler.set_epoch never called: a shuffling sampler's epoch stays the same over many
  iterations ("sampler" records);
- rank-derived checkpoint paths: after the ranks changed, a rank loaded a file named for a rank that
  another node's worker wrote;
- replicas diverged: the ranks of one group fingerprinted different parameters after their first step
  ("params" records; after torchft's check);
- no checkpoint on SIGTERM: a preempted node (SIGTERM, then a grace period) wrote nothing in its grace
  period, and the resume lost steps.
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
import statistics
from datetime import datetime, timezone

from sim.core.history import WorkerRecord
from sim.core.nodes import node_order
from sim.verdict.recovery import recoveries
from sim.verdict.runmodel import RunModel

# The storage every node of a sim cluster shares (the checkpoint volume); with a writable --mount of one host
# folder into every node, that too (_shared_dirs). A save anywhere else is node-local.
SHARED_DIRS = ("/ckpt",)


@dataclasses.dataclass(frozen=True)
class Finding:
    """A pitfall as the diagnoses word it (sim/verdict/diagnoses/registry.py turns it into a Diagnosis)."""

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
    (started afresh), and the save that wrote that file (None where none was seen). A worker's loads are
    matched to its start by node and process."""
    loads = [r for r in run.records if isinstance(r, WorkerRecord) and r.event == "load"]
    saves, shared = _saves(run), _shared_dirs(run)
    groups = []
    for index, cohort in enumerate(run.cohorts):
        if not begin < cohort.t < end:
            continue
        until = run.cohorts[index + 1].t if index + 1 < len(run.cohorts) else float("inf")  # a pid is reused later
        ranks, written_by = [], []
        for start in cohort.starts:
            if not isinstance(start, WorkerRecord) or start.rank is None:
                continue
            mine = [r for r in loads if r.node == start.node and r.pid == start.pid and start.t <= r.t < until]
            path = mine[-1].path if mine else None
            ranks.append((start, path))
            written_by.append(_writer(saves, mine[-1], shared) if path else None)
        paths = {path for _, path in ranks}
        one_file = len(paths) == 1 and None not in paths and is_shared(next(iter(paths)), shared)
        groups.append(
            {"t": cohort.t, "ranks": ranks, "saves": written_by, "cohorts": run.cohorts, "one_file": one_file}
        )
    return groups


def _writer(saves: list[WorkerRecord], load: WorkerRecord, shared: tuple[str, ...]) -> WorkerRecord | None:
    """The last save of the loaded file before the load: on any node for shared storage, else on the loader's."""
    local = not is_shared(load.path or "", shared)
    before = [s for s in saves if s.path == load.path and s.t <= load.t and not (local and s.node != load.node)]
    return before[-1] if before else None


def mixed_sources(group: dict) -> bool:
    """One rank started afresh while others loaded a checkpoint, or they loaded different points. Files of
    several names (per-rank or sharded ones), or of one node-local name on several nodes, are one point when
    the saves that wrote them were one save round: the same optimizer step where the saves know it, else the
    same steps taken by savers of one group. Where the saves are unknown, only different names count."""
    sources = {path for _, path in group["ranks"]}
    if not any(sources) or group.get("one_file"):
        return False
    if not all(sources):
        return True
    round_known = _save_round(group.get("saves") or [], group.get("cohorts") or ())
    return len(sources) > 1 if round_known is None else not round_known


def _save_round(saves: list[WorkerRecord | None], cohorts) -> bool | None:
    """Whether the saves were one save round; None where that cannot be told."""
    if not saves or any(s is None for s in saves):
        return None  # a file whose writing was not seen
    if all(s.step is not None for s in saves):
        return len({s.step for s in saves}) == 1
    if any(s.n is None for s in saves):
        return None
    groups = {sum(1 for c in cohorts if c.t <= s.t) for s in saves}  # the group each saver belonged to
    return len(groups) == 1 and len({s.n for s in saves}) == 1


def source_words(start: WorkerRecord, path: str | None, save: WorkerRecord | None = None) -> str:
    if not path:
        return f"{_who(start)} loaded nothing: it started afresh"
    return f"{_who(start)} loaded {path}{written_words(save)}"


def written_words(save: WorkerRecord | None) -> str:
    """Which save wrote a loaded file: its step where the save knows it, else who wrote it and when (ranks that
    loaded one name, each from its own node's disk, read files of different saves)."""
    if save is None:
        return ""
    if save.step is not None:
        return f" (saved at step {save.step})"
    return f" (written by {save.node} at {_at(save.t)})"


def resumed_apart(run: RunModel) -> Finding | None:
    """Ranks of one group resumed from different points: one loaded nothing while others loaded a checkpoint, or
    they loaded different files. Training goes on, out of step: the replicas differ (DDP broadcasts rank 0's
    weights only at construction) and the job ends out of step."""
    mixed = [g for g in resume_sources(run) if mixed_sources(g)]
    if not mixed:
        return None
    group = mixed[0]
    ranks = sorted(zip(group["ranks"], group["saves"], strict=True), key=lambda item: item[0][0].rank)
    fresh = [start.rank for (start, path), _ in ranks if not path]
    return Finding(
        "resumed-apart",
        "Ranks resumed from different points",
        f"in the group started at {_at(group['t'])} the ranks did not resume from the same checkpoint"
        + (f": rank(s) {', '.join(map(str, fresh))} found none and started afresh" if fresh else "")
        + "; they train on from different states and steps",
        tuple(source_words(start, path, save) for (start, path), save in ranks),
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


def _worker_records(run: RunModel, event: str) -> list[WorkerRecord]:
    return [r for r in run.records if isinstance(r, WorkerRecord) and r.event == event]


# The state a "uses" record names, the key saved_content describes it by, and how the fix saves and loads it.
_SCHEDULE_STATE = {
    "lr_scheduler": ("scheduler_state", "missing-scheduler-state", "LR scheduler", "scheduler"),
    "grad_scaler": ("scaler_state", "missing-scaler-state", "AMP GradScaler", "scaler"),
}


_AFTER_RESUME = {
    "lr_scheduler": "learning rate schedule restarts from its first step",
    "grad_scaler": "loss scale restarts from its initial value (and re-learns it over skipped steps)",
}


def _missing_schedule_state(what: str):
    key, code, name, var = _SCHEDULE_STATE[what]

    def rule(run: RunModel) -> Finding | None:
        described = [r for r in _saves(run) if r.content is not None]
        if not described or getattr(described[0].content, key) is None:
            return None  # no first save described, or by an instrumentation that did not look for this state
        first, content = described[0], described[0].content
        used = [r for r in _worker_records(run, "uses") if r.what == what]
        # The saver's own construction first, where it was seen (the evidence names one process).
        used.sort(key=lambda r: (r.node != first.node or r.pid != first.pid, r.t))
        if getattr(content, key) or not used or not (content.model_state or content.optimizer_state):
            return None
        cls = used[0].cls or name
        keys = content.keys or {}
        shown = ", ".join(f"{k}: {v}" for k, v in list(keys.items())[:8]) or content.type or "?"
        return Finding(
            code,
            f"Checkpoint without {name} state",
            f"the script uses a {cls} but its checkpoint does not hold its state: after a resume the "
            + _AFTER_RESUME[what],
            (f"{_who(used[0])} constructed a {cls}", f"{_who(first)} first save {first.path}: {{{shown}}}"),
            f"save it beside the model and optimizer and load it on resume: "
            f"torch.save({{..., '{var}': {var}.state_dict()}}, path) and {var}.load_state_dict(checkpoint['{var}'])",
        )

    rule.__name__ = f"missing_{var}_state"
    return rule


missing_scheduler_state = _missing_schedule_state("lr_scheduler")
missing_scaler_state = _missing_schedule_state("grad_scaler")

# A sampler iterated this often with one epoch: set_epoch was never called (a few iterations in one epoch are
# a script's own: the tutorial's `next(iter(loader))` for the batch size, a length check).
SAMPLER_ITERATIONS = 4


def sampler_epoch_fixed(run: RunModel) -> Finding | None:
    """A shuffling DistributedSampler iterated SAMPLER_ITERATIONS times or more, its epoch never changed: every
    epoch sees the same shard order (DistributedSampler seeds its shuffle with seed + epoch)."""
    by_sampler: dict[tuple, list[WorkerRecord]] = {}
    for r in _worker_records(run, "sampler"):
        if r.shuffle:
            by_sampler.setdefault((r.node, r.pid, r.sampler), []).append(r)
    fixed: dict[int | None, tuple[WorkerRecord, int]] = {}  # per rank, its process that iterated most
    for records in by_sampler.values():
        epochs = {r.epoch for r in records}
        iterations = max(r.iterations or 0 for r in records)
        if len(epochs) == 1 and iterations >= SAMPLER_ITERATIONS:
            if records[-1].rank not in fixed or iterations > fixed[records[-1].rank][1]:
                fixed[records[-1].rank] = (records[-1], iterations)
    if not fixed:
        return None
    shown = sorted(fixed.values(), key=lambda item: item[0].rank if item[0].rank is not None else 1 << 30)
    epoch, most = shown[0][0].epoch, max(n for _, n in shown)
    evidence = [f"{_who(last)} sampler iterated {n} times, its epoch always {epoch}" for last, n in shown[:4]]
    return Finding(
        "sampler-epoch-fixed",
        "DistributedSampler.set_epoch never called",
        f"the shuffling DistributedSampler's epoch stays {epoch} over {most} iterations: its shuffle is "
        "seeded with seed + epoch, so every epoch visits the same order on every rank",
        tuple(evidence),
        "call sampler.set_epoch(epoch) at the start of every epoch, before iterating the DataLoader: "
        "for epoch in range(start, epochs): loader.sampler.set_epoch(epoch); for batch in loader: ...",
    )


def _rank_in(path: str, rank: int) -> bool:
    """The file's name holds the rank as a number of its own (rank3.pt, ckpt_3.pt, model-rank-3-of-4.pt)."""
    return str(rank) in re.findall(r"\d+", posixpath.basename(path))


def rank_derived_paths(run: RunModel) -> Finding | None:
    """A checkpoint path with the saver's rank in it, loaded by a worker on another node after the ranks
    changed: what that rank held (its data position, its RNG, its shard) is now another worker's."""
    saves = _saves(run)
    ranks_of: dict[str, list[tuple[float, int]]] = {}
    for start in run.starts:
        if isinstance(start, WorkerRecord) and start.rank is not None:
            ranks_of.setdefault(start.node, []).append((start.t, start.rank))
    for load in _worker_records(run, "load"):
        if not load.path or load.rank is None:
            continue
        before = [s for s in saves if s.path == load.path and s.t < load.t]
        if not before:
            continue
        saver = before[-1]
        if saver.rank is None or saver.node == load.node or not _rank_in(load.path, saver.rank):
            continue
        was = [rank for t, rank in ranks_of.get(load.node, []) if t < load.t and rank != load.rank]
        if not was:
            continue  # this node's rank did not change
        evidence = [
            f"{_who(saver)} saved {saver.path}",
            f"{_who(load)} loaded it: {load.node} was rank {was[-1]} before the regroup, and its own rank's file "
            f"is now another's",
        ]
        return Finding(
            "rank-derived-paths",
            "Checkpoint paths derived from the rank",
            f"the checkpoint's name holds the rank ({saver.path}); after the ranks changed, {load.node}'s worker "
            f"(now rank {load.rank}, before rank {was[-1]}) loaded the file {saver.node}'s worker wrote: per-rank "
            "state (data position, RNG, a shard) moved to another worker",
            tuple(evidence),
            "save one checkpoint from rank 0 that every rank loads (the replicas' state is the same), or a sharded "
            "one that reshards on load (torch.distributed.checkpoint); never key saved state by the rank, which "
            "torchrun may hand to another node at each regroup",
        )
    return None


def _cohort_records(run: RunModel, event: str) -> list[tuple[float, list[tuple[WorkerRecord, WorkerRecord]]]]:
    """Per group: (its start time, [(each rank's start, its first `event` record)])."""
    records = _worker_records(run, event)
    groups = []
    for index, cohort in enumerate(run.cohorts):
        until = run.cohorts[index + 1].t if index + 1 < len(run.cohorts) else float("inf")
        pairs = []
        for start in cohort.starts:
            if not isinstance(start, WorkerRecord) or start.rank is None:
                continue
            mine = [r for r in records if r.node == start.node and r.pid == start.pid and start.t <= r.t < until]
            if mine:
                pairs.append((start, mine[0]))
        groups.append((cohort.t, pairs))
    return groups


# Fingerprints this close are one replica's: a sum's last bits may differ with the reduction's order (threads).
FINGERPRINT_TOLERANCE = 1e-9


def _close(a: str, b: str) -> bool:
    try:
        x, y = float(a), float(b)
    except ValueError:
        return a == b
    return abs(x - y) <= FINGERPRINT_TOLERANCE * max(1.0, abs(x), abs(y))


def replicas_diverged(run: RunModel) -> Finding | None:
    """After their first step, the ranks of one group hold different parameters (torchft's check, once per
    start): replicas that DDP keeps in step by their gradients alone stay apart for good."""
    for t, pairs in _cohort_records(run, "params"):
        sizes = {r.numel for _, r in pairs}
        prints: dict[str, list[WorkerRecord]] = {}
        for start, r in pairs:
            fingerprint = str(r.fingerprint)
            same = next((known for known in prints if _close(known, fingerprint)), fingerprint)
            prints.setdefault(same, []).append(start)
        if len(pairs) < 2 or len(sizes) != 1 or len(prints) < 2:
            continue
        groups = sorted(prints.items(), key=lambda item: min(s.rank for s in item[1]))
        words = [
            f"rank(s) {', '.join(str(s.rank) for s in sorted(starts, key=lambda s: s.rank))} "
            f"({', '.join(sorted({s.node for s in starts}, key=node_order))}): parameters sum {fingerprint}"
            for fingerprint, starts in groups
        ]
        return Finding(
            "replicas-diverged",
            "Replicas diverged",
            f"in the group started at {_at(t)} the ranks' parameters differ after their first step: "
            + "; ".join(words)
            + ". DDP averages gradients, never weights, so the replicas train apart from here on",
            tuple(words),
            "give every rank the same weights before training: load the checkpoint before wrapping the model in "
            "DDP (its constructor broadcasts rank 0's), or load it on every rank from the same file",
        )
    return None


def _save_interval(run: RunModel) -> int | None:
    """The steps between one saver's consecutive checkpoints (their median), where steps are known."""
    by_saver: dict[tuple, list[int]] = {}
    for r in _saves(run):
        if r.step is not None:
            by_saver.setdefault((r.node, r.pid), []).append(r.step)
    gaps = [b - a for steps in by_saver.values() for a, b in zip(steps, steps[1:], strict=False) if b > a]
    return int(statistics.median(gaps)) if gaps else None


def no_save_on_sigterm(run: RunModel) -> Finding | None:
    """A preempted node that had saved checkpoints (SIGTERM, then SIGKILL after a grace period) saved nothing in
    its grace period and the resume lost steps: the job does not checkpoint on SIGTERM, so every preemption
    costs up to a checkpoint interval (a job that saves on SIGTERM loses none)."""
    saves = _saves(run)
    for recovery in recoveries(run):
        fault = recovery.fault
        if not fault.kind.preempts or not recovery.steps_lost or recovery.steps_lost <= 0:
            continue
        node = fault.node
        if not any(s.node == node and s.t < fault.t_invoke for s in saves):
            continue  # it never saved (rank 0 of another node does): its SIGTERM alone could not have saved
        if any(s.node == node and fault.t_invoke <= s.t <= fault.t_ok for s in saves):
            continue
        grace = fault.result.grace
        interval = _save_interval(run)
        evidence = [
            f"{node} {_at(fault.t_invoke)}  preempted: SIGTERM, SIGKILL {grace} s later; it saved nothing in between",
            f"step {recovery.steps_before} had been reached; the group resumed from step {recovery.resumed_from}: "
            f"{recovery.steps_lost} steps lost",
        ]
        if interval:
            evidence.append(f"the job checkpoints every {interval} steps: up to {interval} lost per preemption")
        return Finding(
            "no-save-on-sigterm",
            "No checkpoint on SIGTERM",
            f"the job does not checkpoint on SIGTERM: {node}'s preemption (a {grace} s grace period) lost "
            f"{recovery.steps_lost} steps back to the last periodic checkpoint",
            tuple(evidence),
            "save a checkpoint when SIGTERM comes, within the grace period: "
            "signal.signal(signal.SIGTERM, lambda *_: setattr(state, 'stop', True)) and, in the training loop, "
            "after the step: if state.stop: save(); sys.exit(0) (torchrun forwards SIGTERM to the workers)",
        )
    return None


PITFALLS = (
    node_local_checkpoint,
    resumed_apart,
    missing_state,
    missing_scheduler_state,
    missing_scaler_state,
    sampler_epoch_fixed,
    rank_derived_paths,
    replicas_diverged,
    no_save_on_sigterm,
)
# Their codes: a job's own pitfall explains a failed fault wherever its evidence is (the first save, say).
PITFALL_CODES = (
    "node-local-checkpoint",
    "resumed-apart",
    "missing-optimizer-state",
    "missing-scheduler-state",
    "missing-scaler-state",
    "sampler-epoch-fixed",
    "rank-derived-paths",
    "replicas-diverged",
    "no-save-on-sigterm",
)
