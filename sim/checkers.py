"""Checkers: pure functions of a run's history, as in Jepsen's checker.clj.

Each checker takes the history (the list of records described in sim/verdict.py)
and a RunSpec, and returns a CheckResult. Nothing here reads files, clocks or
Docker, so every rule is unit-tested on hand-written histories.

Terms used throughout:
- a *fault* is a fault operation whose `ok` record exists, other than the
  heal operations (heal, unpause) that undo earlier faults;
- a *cohort* is the set of worker processes started together for one
  rendezvous round: their trainer "start" records;
- a fault's *restart* is the first cohort started after the fault was
  invoked, unless training went on after the fault and that cohort came only
  after the next fault; the fault *recovered* at the first progress step after
  its restart (or, when no restart followed, the first one after the fault).

Records are sorted by time first; what follows the run's end (the run "end"
record, or `down` killing the containers still running) is ignored.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import re
import time
from typing import Callable, Sequence

from .verdict import CheckResult, FaultRecovery, Verdict

EXPECTED = ("recovers", "fails")
# Operations that undo faults rather than inject them.
HEAL_OPS = ("heal", "unpause")
# Faults in force until a heal undoes them.
REVERSIBLE_FAULTS = ("pause", "partition", "link")
# Faults that take a whole node out on purpose.
# The agent is its container's main process: killing it takes the whole node out too.
NODE_REMOVING_FAULTS = ("kill-node", "stop-node", "kill-agent")
# Node containers (sim.spec.node_name); others (etcd, the throwaway container
# wipe-etcd runs) have no torchrun agent.
AGENT_CONTAINER = re.compile(r"^node\d+$")
# Start records further apart than this belong to different cohorts even with
# no other evidence (one cohort's starts are within a second or two).
COHORT_GAP_S = 30.0
# Agent records that are written before any worker of their round starts.
RENDEZVOUS_EVENTS = ("rdzv_joined", "rdzv_complete")
# Steps averaged on each side of a resume, so one noisy batch does not decide.
NOISE_WINDOW = 10  # steps whose wobble sets the bar for a loss jump
NOISE_FACTOR = 3.0
LOSS_WINDOW = 3
# At most this many violations listed in one result's reasons.
MAX_EXAMPLES = 5


# ---------------------------------------------------------------- the run's parameters

@dataclasses.dataclass(frozen=True)
class RunSpec:
    """What the checkers need to know about the run, and the bounds they enforce."""

    min_nodes: int
    max_nodes: int
    nproc_per_node: int
    max_restarts: int
    target_steps: int | None = None
    ckpt_interval: int | None = None
    expected: str = "recovers"
    max_recovery_s: float | None = None
    max_steps_lost: int | None = None
    hang_s: float = 60.0
    loss_jump_tolerance: float = 0.5  # relative: 0.5 = the loss may rise by half
    fail_fast_s: float = 60.0

    def __post_init__(self) -> None:
        for name in ("min_nodes", "max_nodes", "nproc_per_node"):
            _require_int(name, getattr(self, name), at_least=1)
        _require_int("max_restarts", self.max_restarts, at_least=0)
        if self.max_nodes < self.min_nodes:
            raise ValueError(f"max_nodes {self.max_nodes} < min_nodes {self.min_nodes}")
        for name in ("target_steps", "ckpt_interval"):
            if getattr(self, name) is not None:
                _require_int(name, getattr(self, name), at_least=1)
        if self.max_steps_lost is not None:
            _require_int("max_steps_lost", self.max_steps_lost, at_least=0)
        if self.expected not in EXPECTED:
            raise ValueError(f"expected {self.expected!r}: must be one of {', '.join(EXPECTED)}")
        if self.max_recovery_s is not None:
            _require_positive("max_recovery_s", self.max_recovery_s)
        for name in ("hang_s", "loss_jump_tolerance", "fail_fast_s"):
            _require_positive(name, getattr(self, name))

    @property
    def min_world(self) -> int:
        return self.min_nodes * self.nproc_per_node

    @property
    def max_world(self) -> int:
        return self.max_nodes * self.nproc_per_node

    @classmethod
    def from_history(cls, history: Sequence[dict], **overrides) -> "RunSpec":
        """The spec recorded in the run "start" record; keyword arguments win over it."""
        start = next((r for r in history if r.get("type") == "run" and r.get("event") == "start"), None)
        values = {}
        if start is not None:
            cluster = start.get("spec") or {}
            min_nodes = cluster.get("min_nodes", 1)
            max_nodes = cluster.get("max_nodes")
            if max_nodes is None:  # ClusterSpec's rule: max_nodes defaults to nodes
                max_nodes = max(cluster.get("nodes", min_nodes), min_nodes)
            values = {"min_nodes": min_nodes, "max_nodes": max_nodes,
                      "nproc_per_node": cluster.get("nproc_per_node"), "max_restarts": cluster.get("max_restarts"),
                      "target_steps": start.get("target_steps"), "ckpt_interval": start.get("ckpt_interval")}
            values = {k: v for k, v in values.items() if v is not None}
        values.update(overrides)
        missing = [f.name for f in dataclasses.fields(cls)
                   if f.default is dataclasses.MISSING and f.name not in values]
        if missing:
            raise ValueError(f"history has no run start record giving {', '.join(missing)}; pass them as overrides")
        return cls(**values)


def _require_int(name: str, value: object, at_least: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < at_least:
        raise ValueError(f"{name} {value!r}: must be a whole number >= {at_least}")


def _require_positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} {value!r}: must be a finite number > 0")


# ---------------------------------------------------------------- the history, parsed once per check

@dataclasses.dataclass(frozen=True)
class _Fault:
    op: str
    fault: str
    target: str | None
    t_invoke: float
    t_ok: float
    result: dict

    @property
    def node(self) -> str | None:
        return self.result.get("node")

    def describe(self) -> str:
        where = self.target or self.node
        if self.node and self.node != where:  # a role ("random", "rank:3") and the node it hit
            where = f"{where} ({self.node})"
        return f"{self.fault} {where} at {_clock(self.t_ok)}" if where else f"{self.fault} at {_clock(self.t_ok)}"

    @property
    def heal_id(self) -> str | None:
        """The id a heal names this fault by (chaos/nemesis.py's fault ids)."""
        if self.fault in ("pause", "link"):
            return f"{self.fault}-{self.node or self.target}"
        if self.fault == "partition":
            return self.result.get("id")
        return None

    def heals(self, fault: "_Fault") -> bool:
        """Whether this heal operation undid `fault`."""
        if self.fault == "unpause":
            return fault.heal_id == f"pause-{self.node or self.target}"
        return self.target in (fault.heal_id, "all") or fault.heal_id in (self.result.get("healed") or ())


@dataclasses.dataclass(frozen=True)
class _Cohort:
    starts: tuple[dict, ...]  # trainer "start" records, in time order

    @property
    def t(self) -> float:
        return self.starts[0]["t"]

    @property
    def world_size(self) -> int | None:
        return self.starts[0].get("world_size")

    @property
    def resumed_from(self) -> int:
        """The oldest step any rank resumed from: the worst case."""
        return min(s.get("resumed_from") or 0 for s in self.starts)


class _Run:
    """The facts checkers share, read from the history sorted by time and cut at the run's end."""

    def __init__(self, history: Sequence[dict]):
        for index, record in enumerate(history):
            if not isinstance(record.get("t"), (int, float)):
                raise ValueError(f"history record {index} has no time 't': {record!r}")
        records = sorted(history, key=lambda r: r["t"])  # stable: equal times keep their order
        ends = [r for r in records if r.get("type") == "run" and r.get("event") == "end"]
        if ends:
            records = [r for r in records if r["t"] <= ends[-1]["t"]]
        teardown = _teardown_start(records)
        if teardown is not None:
            # What `down` does (kill the containers still running) is not the run's doing.
            records = [r for r in records if r["t"] < teardown]
        self.records = records
        self.t_begin = records[0]["t"] if records else 0.0
        self.t_end = records[-1]["t"] if records else 0.0
        trainer = [r for r in records if r.get("type") == "trainer"]
        self.progress = [r for r in trainer if r.get("kind") == "progress"]
        self.progress_times = [r["t"] for r in self.progress]
        self.starts = [r for r in trainer if r.get("kind") == "start"]
        self.summaries = [r for r in trainer if r.get("kind") == "summary"]
        self.agent = [r for r in records if r.get("type") == "agent"]
        self.docker = [r for r in records if r.get("type") == "docker"]
        self.faults, self.heals = _faults(records)
        self.cohorts = _cohorts(self.starts, self.progress_times,
                                [r["t"] for r in self.agent if r.get("event") in RENDEZVOUS_EVENTS])
        self.cohort_times = [c.t for c in self.cohorts]
        nodes = {r.get("node") for r in trainer + self.agent}
        nodes |= {r.get("node") for r in self.docker if AGENT_CONTAINER.match(str(r.get("node")))}
        self.agent_nodes = sorted(nodes - {None}, key=_node_order)

    # --- time queries ---

    def first_progress_after(self, t: float) -> dict | None:
        index = bisect.bisect_right(self.progress_times, t)
        return self.progress[index] if index < len(self.progress) else None

    def last_progress_before(self, t: float) -> dict | None:
        index = bisect.bisect_left(self.progress_times, t)
        return self.progress[index - 1] if index > 0 else None

    def progress_between(self, after: float, before: float) -> bool:
        return _any_between(self.progress_times, after, before)

    def highest_step_before(self, t: float) -> int | None:
        steps = [r["step"] for r in self.progress[:bisect.bisect_left(self.progress_times, t)]]
        return max(steps) if steps else None

    def first_cohort_after(self, t: float) -> _Cohort | None:
        index = bisect.bisect_right(self.cohort_times, t)
        return self.cohorts[index] if index < len(self.cohorts) else None

    def cohort_at(self, t: float) -> _Cohort | None:
        """The newest cohort started at or before t."""
        index = bisect.bisect_right(self.cohort_times, t)
        return self.cohorts[index - 1] if index > 0 else None

    def cohort_progress(self, cohort: _Cohort) -> list[dict]:
        later = self.first_cohort_after(cohort.t)
        stop = bisect.bisect_left(self.progress_times, later.t) if later else len(self.progress)
        return self.progress[bisect.bisect_right(self.progress_times, cohort.t):stop]

    # --- the job and its nodes ---

    def finished(self, spec: RunSpec) -> dict | None:
        """The summary that says the job reached its final step, if any."""
        return next((s for s in self.summaries
                     if spec.target_steps is None or s.get("final_step") == spec.target_steps), None)

    @property
    def t_training_ended(self) -> float:
        return self.summaries[0]["t"] if self.summaries else math.inf

    def lifecycle(self, node: str) -> dict | None:
        """The node container's last docker start or die record."""
        events = [r for r in self.docker if r.get("node") == node and r.get("action") in ("start", "die")]
        return events[-1] if events else None

    def removed_on_purpose(self) -> dict[str, _Fault]:
        """Nodes a fault took out (kill/stop, scale-down) and that never started again."""
        removed = {}
        for fault in self.faults:
            if fault.fault in NODE_REMOVING_FAULTS:
                nodes = [fault.node or fault.target]
            elif fault.fault == "scale":
                nodes = fault.result.get("left") or []
            else:
                continue
            for node in nodes:
                restarted = any(r.get("node") == node and r.get("action") == "start" and r["t"] > fault.t_invoke
                                for r in self.docker)
                if not restarted:
                    removed[node] = fault
        return removed


def _teardown_start(records: list[dict]) -> float | None:
    """When `down` began: the first docker kill of a node container that no fault operation
    explains. A safety net: down() writes the run "end" record before it removes the
    containers, but a history cut short (a killed harness) may have no end record."""
    in_progress, operations = {}, []  # op -> invoke time; (invoke, outcome) times
    for record in records:
        if record.get("type") == "fault":
            if record.get("phase") == "invoke":
                in_progress[record.get("op")] = record["t"]
            elif record.get("op") in in_progress:
                operations.append((in_progress.pop(record.get("op")), record["t"]))
        elif (record.get("type") == "docker" and record.get("action") == "kill"
              and AGENT_CONTAINER.match(str(record.get("node"))) and not in_progress
              and not any(begin <= record["t"] <= end for begin, end in operations)):
            return record["t"]
    return None


def _faults(records: list[dict]) -> tuple[list[_Fault], list[_Fault]]:
    """(faults, heal operations) that completed (`ok`), in time order."""
    invoked, faults, heals = {}, [], []
    for record in records:
        if record.get("type") != "fault":
            continue
        if record.get("phase") == "invoke":
            invoked[record.get("op")] = record["t"]
        elif record.get("phase") == "ok":
            fault = _Fault(op=record.get("op"), fault=record.get("fault"), target=record.get("target"),
                           t_invoke=invoked.get(record.get("op"), record["t"]), t_ok=record["t"],
                           result=record.get("result") or {})
            (heals if fault.fault in HEAL_OPS else faults).append(fault)
    return faults, heals


def _cohorts(starts: list[dict], progress_times: list[float], rendezvous_times: list[float]) -> list[_Cohort]:
    """Group start records into cohorts.

    A start opens a new cohort when its world size differs from the current
    cohort's, when it comes more than COHORT_GAP_S after the previous start,
    or when a progress record or an agent rendezvous record lies between the
    two: every worker writes "start" before its first collective, so no
    progress (and no rendezvous of a later round) can fall inside one cohort.
    """
    groups: list[list[dict]] = []
    for start in starts:
        if groups and _same_cohort(groups[-1], start, progress_times, rendezvous_times):
            groups[-1].append(start)
        else:
            groups.append([start])
    return [_Cohort(tuple(group)) for group in groups]


def _same_cohort(group: list[dict], start: dict, progress_times: list[float], rendezvous_times: list[float]) -> bool:
    previous = group[-1]
    if start.get("world_size") != group[0].get("world_size") or start["t"] - previous["t"] > COHORT_GAP_S:
        return False
    return not any(_any_between(times, previous["t"], start["t"]) for times in (progress_times, rendezvous_times))


def _any_between(sorted_times: list[float], after: float, before: float) -> bool:
    return bisect.bisect_left(sorted_times, before) > bisect.bisect_right(sorted_times, after)


# ---------------------------------------------------------------- fault recoveries (shared by several checkers)

@dataclasses.dataclass(frozen=True)
class _Recovery:
    fault: _Fault
    restart: _Cohort | None  # the cohort the fault led to; None: training went on without a restart
    first_progress: dict | None  # the first step after the restart (or after the fault): recovery
    steps_before: int | None  # highest step reached before the restart
    resumed_from: int | None  # step the recovering cohort resumed from
    world_before: int | None

    @property
    def steps_lost(self) -> int | None:
        if self.restart is None:
            return 0 if self.first_progress else None
        return (self.steps_before or 0) - self.resumed_from

    @property
    def world_after(self) -> int | None:
        if self.first_progress:
            return self.first_progress.get("world_size")
        return self.restart.world_size if self.restart else self.world_before

    def public(self) -> FaultRecovery:
        t_recovered = self.first_progress["t"] if self.first_progress else None
        return FaultRecovery(op=self.fault.op, fault=self.fault.fault, target=self.fault.target,
                             t_fault=self.fault.t_ok, t_recovered=t_recovered,
                             recovery_s=None if t_recovered is None else round(t_recovered - self.fault.t_ok, 3),
                             steps_lost=self.steps_lost, world_before=self.world_before, world_after=self.world_after)


def _faults_during_training(run: _Run) -> list[_Fault]:
    return [f for f in run.faults if f.t_invoke < run.t_training_ended]


def _recoveries(run: _Run) -> list[_Recovery]:
    faults = _faults_during_training(run)
    return [_recovery(run, fault, faults[i + 1] if i + 1 < len(faults) else None)
            for i, fault in enumerate(faults)]


def _recovery(run: _Run, fault: _Fault, next_fault: _Fault | None) -> _Recovery:
    before = run.last_progress_before(fault.t_invoke)
    world_before = before.get("world_size") if before else None
    # From the invoke: a slow fault (stop with a grace period, scale) may see the restart before its ok.
    restart = run.first_cohort_after(fault.t_invoke)
    if (restart and next_fault and restart.t > next_fault.t_invoke
            and run.progress_between(fault.t_ok, next_fault.t_invoke)):
        restart = None  # training went on after this fault; the restart belongs to a later one
    if restart is None:
        return _Recovery(fault, None, run.first_progress_after(fault.t_ok), None, None, world_before)
    first = run.first_progress_after(max(restart.t, fault.t_ok))
    recovering = run.cohort_at(first["t"]) if first else restart
    return _Recovery(fault, restart, first, run.highest_step_before(restart.t), recovering.resumed_from,
                     world_before)


# ---------------------------------------------------------------- checkers

def check_completed(history: Sequence[dict], spec: RunSpec) -> CheckResult:
    """The job reached its final step and every agent still in the job exited 0."""
    run = _Run(history)
    reasons = []
    if run.finished(spec) is None:
        reasons.append(_not_finished_reason(run, spec))
    removed = run.removed_on_purpose()
    for node in run.agent_nodes:
        if node in removed:
            continue
        last = run.lifecycle(node)
        if last is None or last.get("action") != "die":
            reasons.append(f"{node}: no agent exit recorded (still running at the run end?)")
        elif last.get("exit_code") != 0:
            reasons.append(f"{node}'s agent exited {_exit_text(last)} at {_clock(last['t'])}")
    valid = not reasons
    excused = [node for node in run.agent_nodes if node in removed]
    reasons += [f"{node} excused: taken out by {removed[node].describe()}" for node in excused]
    return CheckResult("completed", valid, tuple(reasons), {"final_step": _highest_step(run), "excused_nodes": excused})


def check_restart_budget(history: Sequence[dict], spec: RunSpec) -> CheckResult:
    """Restarts used per node stay within max_restarts."""
    run = _Run(history)
    used: dict[str, int] = {}
    # An agent logs "k/m attempts left" just before restart number m-k+1.
    for record in run.agent:
        if record.get("event") == "group_failed" and record.get("attempts_left") is not None:
            budget = spec.max_restarts if record.get("max_restarts") is None else record["max_restarts"]
            _raise(used, record.get("node"), budget - record["attempts_left"] + 1)
    # The workers see the same count as TORCHELASTIC_RESTART_COUNT.
    for record in run.starts + run.progress:
        _raise(used, record.get("node"), record.get("restart") or 0)
    per_node = {node: used[node] for node in sorted(used, key=_node_order)}
    reasons = [f"{node} used {count} restarts > max {spec.max_restarts}"
               for node, count in per_node.items() if count > spec.max_restarts]
    valid = not reasons
    reasons.append(f"torch counts restarts per agent, not per job: {sum(per_node.values())} in all "
                   f"across {len(per_node)} nodes, each allowed {spec.max_restarts}")
    return CheckResult("restart_budget", valid, tuple(reasons), {"per_node": per_node})


def check_world_size(history: Sequence[dict], spec: RunSpec) -> CheckResult:
    """Every trainer's world size lies within [min_nodes, max_nodes] x nproc_per_node."""
    run = _Run(history)
    bad: dict[int, dict] = {}  # world size -> first record that reported it
    for record in run.starts + run.progress:
        world = record.get("world_size")
        if not (isinstance(world, int) and spec.min_world <= world <= spec.max_world):
            bad.setdefault(world, record)
    reasons = [f"rank {r.get('rank')} on {r.get('node')} reported world size {world} at {_clock(r['t'])}, "
               f"outside [{spec.min_world}, {spec.max_world}] ({spec.min_nodes}..{spec.max_nodes} nodes "
               f"x {spec.nproc_per_node} workers)" for world, r in bad.items()]
    seen = sorted({r.get("world_size") for r in run.progress if isinstance(r.get("world_size"), int)})
    return CheckResult("world_size", not reasons, tuple(reasons[:MAX_EXAMPLES]), {"world_sizes": seen})


def check_ranks(history: Sequence[dict], spec: RunSpec) -> CheckResult:
    """Each cohort's workers hold ranks 0..W-1, once each."""
    run = _Run(history)
    reasons = [reason for cohort in run.cohorts for reason in _rank_problems(cohort)]
    return CheckResult("ranks", not reasons, tuple(reasons[:MAX_EXAMPLES]), {"cohorts": len(run.cohorts)})


def _rank_problems(cohort: _Cohort) -> list[str]:
    world = cohort.world_size
    where = f"the cohort started at {_clock(cohort.t)} (world {world})"
    ranks = [s.get("rank") for s in cohort.starts]
    problems = [f"{where}: rank {rank} started {ranks.count(rank)} times"
                for rank in sorted(set(ranks), key=_rank_order) if ranks.count(rank) > 1]
    if not isinstance(world, int):
        return problems + [f"{where}: no world size recorded"]
    outside = sorted({r for r in ranks if not (isinstance(r, int) and 0 <= r < world)}, key=_rank_order)
    if outside:
        problems.append(f"{where}: {_ranks(outside)} outside 0..{world - 1}")
    missing = sorted(set(range(world)) - set(ranks))
    if missing:
        problems.append(f"{where}: {_ranks(missing)} never started")
    return problems


def check_progress(history: Sequence[dict], spec: RunSpec) -> CheckResult:
    """Training resumes from the last checkpoint after each fault and never skips a step."""
    run = _Run(history)
    recoveries = _recoveries(run)
    reasons = _skipped_steps(run) + _resume_disagreements(run)
    for recovery in recoveries:
        reasons += _steps_lost_problems(recovery, spec)
    lost = {r.fault.op: r.steps_lost for r in recoveries}
    return CheckResult("progress", not reasons, tuple(reasons[:MAX_EXAMPLES]),
                       {"steps_lost": lost, "final_step": _highest_step(run)})


def _skipped_steps(run: _Run) -> list[str]:
    """Per rank, each step is the previous one + 1, and a start's first step is resumed_from + 1."""
    by_rank: dict[object, list[dict]] = {}
    for record in run.records:
        if record.get("type") == "trainer" and record.get("kind") in ("start", "progress"):
            by_rank.setdefault(record.get("rank"), []).append(record)
    problems = []
    for rank in sorted(by_rank, key=_rank_order):
        expected, restarted_at = None, None
        for record in by_rank[rank]:
            if record.get("kind") == "start":
                expected, restarted_at = (record.get("resumed_from") or 0) + 1, record["t"]
            elif record.get("kind") == "progress":
                step = record.get("step")
                if expected is not None and step != expected:
                    problems.append(_step_problem(rank, expected, step, record["t"], restarted_at))
                expected, restarted_at = step + 1, None
    return problems


def _step_problem(rank, expected: int, step: int, t: float, restarted_at: float | None) -> str:
    when = f"after the restart at {_clock(restarted_at)}" if restarted_at is not None else f"at {_clock(t)}"
    if step > expected:
        skipped = f"step {expected}" if step == expected + 1 else f"steps {expected}..{step - 1}"
        return f"rank {rank} skipped {skipped} {when}"
    return f"rank {rank} went back to step {step} when step {expected} was due, {when}"


def _resume_disagreements(run: _Run) -> list[str]:
    problems = []
    for cohort in run.cohorts:
        by_step: dict[int, list] = {}
        for start in cohort.starts:
            by_step.setdefault(start.get("resumed_from") or 0, []).append(start.get("rank"))
        if len(by_step) > 1:
            detail = "; ".join(f"{_ranks(sorted(ranks, key=_rank_order))} from step {step}"
                               for step, ranks in sorted(by_step.items()))
            problems.append(f"the cohort started at {_clock(cohort.t)} resumed from different steps: {detail}")
    return problems


def _steps_lost_problems(recovery: _Recovery, spec: RunSpec) -> list[str]:
    lost = recovery.steps_lost
    if lost is None or recovery.restart is None:
        return []
    what = (f"after {recovery.fault.describe()}: {lost} steps lost "
            f"(reached {recovery.steps_before or 0}, resumed from {recovery.resumed_from})")
    problems = []
    if spec.ckpt_interval is not None and lost > spec.ckpt_interval:
        problems.append(f"{what} > checkpoint interval {spec.ckpt_interval}")
    if spec.max_steps_lost is not None and lost > spec.max_steps_lost:
        problems.append(f"{what} > max {spec.max_steps_lost}")
    return problems


def check_loss_continuity(history: Sequence[dict], spec: RunSpec) -> CheckResult:
    """After each resume the loss carries on from where the checkpoint left it."""
    run = _Run(history)
    reasons, jumps = [], []
    for cohort in run.cohorts:
        if cohort.resumed_from == 0:
            continue  # a fresh start: nothing to continue from
        after = _first_losses(run, cohort)
        # The steps after a resume replay steps that already ran before the fault: compare
        # the same steps where possible (immune to the loss's own ups and downs), else the
        # last steps at or before the resumed one.
        replayed = _losses_before(run, cohort)
        overlap = sorted(set(after) & set(replayed))
        if overlap:
            before, after = {s: replayed[s] for s in overlap}, {s: after[s] for s in overlap}
        else:
            before = _losses_up_to(run, cohort)
        if not before or not after:
            continue
        mean_before, mean_after = _mean(before.values()), _mean(after.values())
        jump = (mean_after - mean_before) / max(abs(mean_before), 1e-12)
        jumps.append(round(jump, 4))
        # Minibatch losses wobble on their own (early in training by more than 50%): a rise
        # counts only when it also stands out from the step-to-step noise seen before the fault.
        noise = _step_noise(_losses_before(run, cohort), cohort.resumed_from)
        # Only a rise counts: the loss falling while training is progress, not a fault.
        if not math.isfinite(mean_after) or (jump > spec.loss_jump_tolerance
                                             and mean_after - mean_before > NOISE_FACTOR * noise):
            reasons.append(f"loss jumped {jump:+.0%} after the resume from step {cohort.resumed_from} at "
                           f"{_clock(cohort.t)}: {mean_before:.4g} over steps {_span(before)} before, "
                           f"{mean_after:.4g} over steps {_span(after)} after (tolerance {spec.loss_jump_tolerance:.0%})")
    return CheckResult("loss_continuity", not reasons, tuple(reasons[:MAX_EXAMPLES]), {"relative_jumps": jumps})


def _step_noise(losses: dict[int, float], up_to_step: int) -> float:
    """Mean absolute change between consecutive steps over the NOISE_WINDOW steps up to `up_to_step`."""
    steps = [s for s in sorted(losses) if s <= up_to_step][-NOISE_WINDOW:]
    diffs = [abs(losses[b] - losses[a]) for a, b in zip(steps, steps[1:]) if b == a + 1]
    return _mean(diffs) if diffs else 0.0


def _losses_before(run: _Run, cohort: _Cohort) -> dict[int, float]:
    """Every step's loss as last recorded before the cohort started."""
    latest: dict[int, float] = {}
    for record in run.progress[:bisect.bisect_left(run.progress_times, cohort.t)]:
        if record.get("loss") is not None:
            latest[record["step"]] = record["loss"]
    return latest


def _losses_up_to(run: _Run, cohort: _Cohort) -> dict[int, float]:
    """Loss of the last LOSS_WINDOW steps at or before the resumed step, as last recorded before the cohort."""
    latest: dict[int, float] = {}
    for record in run.progress[:bisect.bisect_left(run.progress_times, cohort.t)]:
        if record.get("step", 0) <= cohort.resumed_from and record.get("loss") is not None:
            latest[record["step"]] = record["loss"]
    return {step: latest[step] for step in sorted(latest)[-LOSS_WINDOW:]}


def _first_losses(run: _Run, cohort: _Cohort) -> dict[int, float]:
    """Loss of the cohort's first LOSS_WINDOW steps (the loss is all-reduced: any rank's will do)."""
    first: dict[int, float] = {}
    for record in run.cohort_progress(cohort):
        if record.get("loss") is not None:
            first.setdefault(record["step"], record["loss"])
    return {step: first[step] for step in sorted(first)[:LOSS_WINDOW]}


def check_hang(history: Sequence[dict], spec: RunSpec) -> CheckResult:
    """No stretch longer than hang_s without progress while no fault is in force."""
    run = _Run(history)
    active = _active_intervals(run, spec)
    stretches = list(zip(run.progress_times, run.progress_times[1:]))
    if run.finished(spec) is None:  # the job stopped short: the tail counts too
        stretches.append((run.progress_times[-1] if run.progress else run.t_begin, run.t_end))
    reasons = []
    for begin, end in stretches:
        if end - begin <= spec.hang_s:
            continue
        for quiet_begin, quiet_end in _uncovered(begin, end, active):
            if quiet_end - quiet_begin > spec.hang_s:
                reasons.append(f"no progress for {quiet_end - quiet_begin:.1f} s ({_clock(quiet_begin)} to "
                               f"{_clock(quiet_end)}) with no fault in force (limit {spec.hang_s:g} s)")
    return CheckResult("hang", not reasons, tuple(reasons[:MAX_EXAMPLES]),
                       {"longest_gap_s": round(max((e - b for b, e in stretches), default=0.0), 3)})


def _active_intervals(run: _Run, spec: RunSpec) -> list[tuple[float, float]]:
    """When each fault was in force: a reversible one until its heal (or the end);
    any other until it recovered, or for hang_s after it if it never did."""
    recovered = {r.fault.op: r.first_progress["t"] for r in _recoveries(run) if r.first_progress}
    intervals = []
    for fault in run.faults:
        if fault.fault in REVERSIBLE_FAULTS:
            healed = next((h.t_ok for h in run.heals if h.t_ok >= fault.t_ok and h.heals(fault)), run.t_end)
            intervals.append((fault.t_invoke, healed))
        else:
            intervals.append((fault.t_invoke, recovered.get(fault.op, fault.t_ok + spec.hang_s)))
    return sorted(intervals)


def _uncovered(begin: float, end: float, intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The parts of [begin, end] that no interval covers (intervals sorted by start)."""
    pieces, cursor = [], begin
    for start, stop in intervals:
        if stop <= cursor or start >= end:
            continue
        if start > cursor:
            pieces.append((cursor, start))
        cursor = max(cursor, stop)
    if cursor < end:
        pieces.append((cursor, end))
    return pieces


def check_recovery(history: Sequence[dict], spec: RunSpec) -> CheckResult:
    """Every fault was followed by training again, within max_recovery_s if given."""
    run = _Run(history)
    recoveries = _recoveries(run)
    problems, facts = [], []
    for recovery in recoveries:
        public = recovery.public()
        what = recovery.fault.describe()
        if public.recovery_s is None:
            problems.append(f"{what}: never recovered (no progress after it"
                            + (f"; workers restarted at {_clock(recovery.restart.t)})" if recovery.restart else ")"))
        elif spec.max_recovery_s is not None and public.recovery_s > spec.max_recovery_s:
            problems.append(f"{what}: recovered in {public.recovery_s:.1f} s > max {spec.max_recovery_s:g} s")
        else:
            facts.append(f"{what}: recovered in {public.recovery_s:.1f} s at world {public.world_after}, "
                         f"{public.steps_lost} steps lost")
    late = [f for f in run.faults if f.t_invoke >= run.t_training_ended]
    facts += [f"{f.describe()}: after training ended, not checked" for f in late]
    return CheckResult("recovery", not problems, tuple(problems + facts),
                       {"recoveries": [dataclasses.asdict(r.public()) for r in recoveries]})


def check_fails_cleanly(history: Sequence[dict], spec: RunSpec) -> CheckResult:
    """For a run meant to fail: it did not complete, and every agent exited non-zero
    (or was killed) within fail_fast_s of the fault, none left hanging."""
    run = _Run(history)
    reasons = []
    finished = run.finished(spec)
    if finished is not None:
        reasons.append(f"the job completed (step {finished.get('final_step')} at {_clock(finished['t'])}) "
                       "but was expected to fail")
    removed = run.removed_on_purpose()
    ended = {}  # node -> the fault its exit followed (op) and how long after
    for node in run.agent_nodes:
        last = run.lifecycle(node)
        if last is None or last.get("action") != "die":
            reasons.append(f"{node} still running at the run end: the job hung instead of failing")
            continue
        if last.get("exit_code") == 0 and node not in removed:
            reasons.append(f"{node}'s agent exited 0 at {_clock(last['t'])}, as if the job had succeeded")
        cause = _last_fault_before(run, last["t"])
        # An exit while the fault was still being injected (its ok not yet written) counts as immediate.
        delay = max(0.0, last["t"] - cause.t_ok) if cause else last["t"] - run.t_begin
        ended[node] = {"after_op": cause.op if cause else None, "delay_s": round(delay, 3),
                       "since_invoke_s": round(last["t"] - cause.t_invoke, 3) if cause else None}
        if delay > spec.fail_fast_s:
            after = f"after {cause.describe()}" if cause else "after the run started"
            reasons.append(f"{node} exited {delay:.1f} s {after} > fail_fast {spec.fail_fast_s:g} s")
    return CheckResult("fails_cleanly", not reasons, tuple(reasons[:MAX_EXAMPLES]),
                       {"exits": {n: _exit_summary(run.lifecycle(n)) for n in run.agent_nodes},
                        "ended": ended})


def _last_fault_before(run: _Run, t: float) -> _Fault | None:
    before = [f for f in run.faults if f.t_invoke <= t]
    return before[-1] if before else None


# ---------------------------------------------------------------- all together

CHECKERS: dict[str, Callable[[Sequence[dict], RunSpec], CheckResult]] = {
    "completed": check_completed,
    "restart_budget": check_restart_budget,
    "world_size": check_world_size,
    "ranks": check_ranks,
    "progress": check_progress,
    "loss_continuity": check_loss_continuity,
    "hang": check_hang,
    "recovery": check_recovery,
    "fails_cleanly": check_fails_cleanly,
}
CHECKS_FOR = {
    "recovers": ("completed", "restart_budget", "world_size", "ranks", "progress", "loss_continuity", "hang",
                 "recovery"),
    # A failing run stops where it stops: progress, loss and recovery say nothing about it.
    "fails": ("fails_cleanly", "restart_budget", "world_size", "ranks"),
}


def check_all(history: Sequence[dict], spec: RunSpec, only: Sequence[str] | None = None) -> Verdict:
    """Run the checkers that apply to the spec's expected outcome (or just those in `only`;
    restart_budget always runs, since the verdict reports restarts per node from it)."""
    names = CHECKS_FOR[spec.expected] if only is None else \
        tuple(dict.fromkeys([*only, "restart_budget"]))
    results = tuple(CHECKERS[name](history, spec) for name in names)
    by_name = {r.name: r for r in results}
    recoveries = tuple(FaultRecovery(**d) for d in by_name["recovery"].metrics["recoveries"]) \
        if "recovery" in by_name else ()
    return Verdict(valid=all(r.valid for r in results), expected=spec.expected, results=results,
                   recoveries=recoveries, restarts_per_node=dict(by_name["restart_budget"].metrics["per_node"]),
                   rounds=_rounds(_Run(history)))


def _rounds(run: _Run) -> int:
    """Distinct rendezvous rounds the agents joined; cohorts when no agent said."""
    rounds = {r.get("round") for r in run.agent if r.get("event") == "rdzv_joined" and r.get("round") is not None}
    return len(rounds) if rounds else len(run.cohorts)


# ---------------------------------------------------------------- small helpers

def _clock(t: float) -> str:
    """Wall-clock time of day, UTC (as `docker logs --timestamps` prints it)."""
    return time.strftime("%H:%M:%S", time.gmtime(t))


def _node_order(name: str) -> tuple[int, str]:
    digits = name[4:] if name.startswith("node") else ""
    return (int(digits) if digits.isdigit() else 10**6, name)


def _rank_order(rank) -> tuple[int, object]:
    """Ranks in numeric order; anything not a number after them."""
    return (0, rank) if isinstance(rank, int) else (1, str(rank))


def _raise(counts: dict, key, value: int) -> None:
    if key is not None:
        counts[key] = max(counts.get(key, 0), value)


def _highest_step(run: _Run) -> int | None:
    return max((r.get("step", 0) for r in run.progress), default=None)


def _not_finished_reason(run: _Run, spec: RunSpec) -> str:
    goal = f"step {spec.target_steps}" if spec.target_steps is not None else "its end"
    if not run.progress:
        return f"the job never reached {goal}: no progress at all"
    last = run.progress[-1]
    return (f"the job never reached {goal}: highest step {_highest_step(run)}, "
            f"last progress at {_clock(last['t'])}, no trainer summary")


def _exit_text(die: dict) -> str:
    code = die.get("exit_code")
    return "with an unknown exit code" if code is None else str(code)


def _exit_summary(record: dict | None) -> str:
    if record is None or record.get("action") != "die":
        return "running"
    return f"exited {_exit_text(record)}"


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


def _span(losses: dict[int, float]) -> str:
    steps = sorted(losses)
    return str(steps[0]) if len(steps) == 1 else f"{steps[0]}..{steps[-1]}"


def _ranks(ranks: list) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(str(r) for r in ranks)
