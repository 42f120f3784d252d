"""The run model: a run's history read once into the facts the checkers and the report share.

A pure function of the history (typed records, sim/core/history.py): nothing here reads files,
clocks or Docker.

Any `torchrun` script is a subject, not only the shipped trainer, so "training" is defined
from what every job has, richest source first:

- *steps* (the step source): the shipped trainer's JSON progress lines ("trainer"); else the
  script's own progress, from the one-line API or `--progress-regex` ("script"); else the
  optimizer step hooks the node image installs in every worker ("optimizer": absolute when the
  optimizer's state holds a step, as Adam's does; else "optimizer-relative", counted per worker
  process, so a resume restarts the count); else none.
- *beats*: every sign that workers are training (steps, collective calls, script progress);
  hangs and node lanes are timed from these, and recoveries from the first step among them
  (from the first collective call for a script that never steps).
- *starts* and *cohorts*: the worker processes started together for one rendezvous round, from
  the trainer's "start" lines or else the instrumentation's worker "start" records.
- *zombies*: a record from a worker of an older round that wrote after the group moved on
  (a frozen node woken up): it belongs to its own round, not to the job's progress now.

Records are sorted by time first; what follows the run's end (the run "end" record, or `down`
killing the containers still running) is left out, except from `all_records` (for the report's lanes).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import re
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone

from sim.core.faultkinds import FaultKind, kind_of
from sim.core.history import (
    AgentRecord,
    DockerRecord,
    FaultRecord,
    FaultResult,
    Record,
    RecordedSpec,
    RunRecord,
    TrainerRecord,
    WorkerRecord,
    as_records,
)
from sim.core.nodes import node_order

# Node containers (sim.core.spec.node_name); others (etcd, the throwaway container
# wipe-etcd runs) have no torchrun agent.
AGENT_CONTAINER = re.compile(r"^node\d+$")
# Start records further apart than this belong to different cohorts even with
# no other evidence (one cohort's starts are within a second or two).
COHORT_GAP_S = 30.0
# Agent records that are written before any worker of their round starts.
RENDEZVOUS_EVENTS = ("rdzv_joined", "rdzv_complete")
# Agent records written only once a round's workers were spawned (the spawn itself, their end, a
# membership change): after one of these, a node's rendezvous record is of a newer round.
ROUND_SPAWNED_EVENTS = ("group_started", "worker_failed", "group_failed", "new_nodes", "group_finished")
# Instrumentation records that show a worker training.
WORKER_BEATS = ("step", "activity", "progress")

# Step sources, richest first (see the module docstring).
STEP_SOURCES = ("trainer", "script", "optimizer", "optimizer-relative", "none")
ABSOLUTE_STEP_SOURCES = ("trainer", "script", "optimizer")
STEP_SOURCE_WORDS = {
    "trainer": "the shipped trainer's progress lines",
    "script": "the script's own progress (progress regex or API)",
    "optimizer": "optimizer steps (step count from the optimizer's state)",
    "optimizer-relative": "optimizer steps (counted per worker process: a resume restarts the count)",
    "none": "no step seen",
}


# More nodes than any spec can ask for (sim.core.spec refuses what the machine cannot hold).
MAX_SPEC_NODES = 100_000
# Records that count as training steps (the others that show training are collective calls).
STEP_EVENTS = ("step", "progress")
# Group starts closer than this belong to one rendezvous round (the agents start together).
ROUND_GAP_S = 5.0


@dataclasses.dataclass(frozen=True)
class FaultEvent:
    """One occurrence of a fault in a run (its kind is `.kind`): a fault operation that took effect, from its
    `ok` record (or `info`: outcome unknown) and its invoke time."""

    op: str
    fault: str
    target: str | None
    t_invoke: float
    t_ok: float  # when its ok (or info) record was written
    # Its kind's typed result (FaultKind.read_result: a partition's has its cuts, a scale's who joined and left);
    # the record's common one or a dict (a hand-written event) is parsed as that.
    result: FaultResult
    outcome: str = "ok"  # "ok" | "info"

    def __post_init__(self) -> None:
        object.__setattr__(self, "result", self.kind.read_result(self.result))

    @property
    def kind(self) -> FaultKind:
        """What this kind of fault is (sim.core.faultkinds): its traits, its undo."""
        return kind_of(self.fault)

    @property
    def node(self) -> str | None:
        return self.result.node

    @property
    def where(self) -> str | None:
        """The node it acted on, else its target."""
        return self.node or self.target

    def describe(self) -> str:
        where = self.target or self.node
        if self.node and self.node != where:  # a role ("random", "rank:3") and the node it hit
            where = f"{where} ({self.node})"
        return f"{self.fault} {where} at {clock(self.t_ok)}" if where else f"{self.fault} at {clock(self.t_ok)}"

    @property
    def spares_training(self) -> bool:
        """It touched no training node's workers or their links to each other: a fault of etcd's
        container, or a partition that cuts no training node from another (history since cuts
        were recorded)."""
        if self.kind.cuts_links:
            cuts = self.result.cuts
            return cuts is not None and not any(all(AGENT_CONTAINER.match(str(n)) for n in cut) for cut in cuts)
        return self.node is not None and not AGENT_CONTAINER.match(self.node)

    @property
    def heal_id(self) -> str | None:
        """The id a heal names this fault by (sim/faults/nemesis.py's fault ids)."""
        if not self.kind.reversible:
            return None
        # The id the nemesis gave; a pause or link fault of an older history has none: its node's.
        return self.result.id or (self.where and self.kind.in_force_id(self.where))

    def heals(self, fault: FaultEvent) -> bool:
        """Whether this heal operation undid `fault`."""
        if self.kind.undoes_in_force is not None:  # an unpause: the pause of its node
            return fault.heal_id == f"{self.kind.undoes_in_force}-{self.where}"
        if self.target in (fault.heal_id, "all"):
            return True
        return self.kind.undoes_by_id and fault.heal_id in (self.result.healed or ())  # a heal's result names them


Beat = TrainerRecord | WorkerRecord


@dataclasses.dataclass(frozen=True)
class Cohort:
    starts: tuple[Beat, ...]  # "start" records (trainer or worker), in time order
    # The step training resumed from (worst case over the ranks); None where the step source
    # cannot tell (no steps, or steps counted per process).
    resumed_from: int | None = 0

    @property
    def t(self) -> float:
        return self.starts[0].t

    @property
    def world_size(self) -> int | None:
        return self.starts[0].world_size

    @property
    def nodes(self) -> frozenset:
        return frozenset(s.node for s in self.starts)


@dataclasses.dataclass(frozen=True)
class Resume:
    """Training started again after the first start: a cohort, or (where no worker says when it
    started) a round of the agents' group starts."""

    t: float
    resumed_from: int | None  # None: a fresh start is not told from a resume, or the step is unknown
    until: float  # the next start, or infinity


class RunModel:
    """The facts checkers, diagnoses and the report share, read from the history sorted by time and cut at the
    run's end. `all_records` keeps what follows the end (the teardown the report draws)."""

    def __init__(self, history: Iterable[Record | Mapping], *, skipped_lines: int = 0):
        self.all_records: list[Record] = sorted(as_records(history), key=lambda r: r.t)  # stable
        self.skipped_lines = skipped_lines  # history lines that were not a record
        runs = [r for r in self.all_records if isinstance(r, RunRecord)]
        self.start = next((r for r in runs if r.event == "start"), None)
        self.scenario = next((r for r in runs if r.event == "scenario"), None)
        records = self.all_records
        ends = [r for r in runs if r.event == "end"]
        if ends:
            records = [r for r in records if r.t <= ends[-1].t]
        teardown = _teardown_start(records)
        if teardown is not None:
            # What `down` does (kill the containers still running) is not the run's doing.
            records = [r for r in records if r.t < teardown]
        self.records = records
        self.t_begin = records[0].t if records else 0.0
        self.t_end = records[-1].t if records else 0.0
        # When the run stopped: `down`'s first kill where the history has no end record before it
        self.t_stopped = max(self.t_end, teardown) if teardown is not None else self.t_end
        trainer = [r for r in records if isinstance(r, TrainerRecord)]
        worker = [r for r in records if isinstance(r, WorkerRecord)]
        self.summaries = [r for r in trainer if r.kind == "summary"]
        self.agent = [r for r in records if isinstance(r, AgentRecord)]
        self.docker = [r for r in records if isinstance(r, DockerRecord)]
        self.applied_faults, self.heals = _faults(records)
        self.faults = [f for f in self.applied_faults if f.outcome == "ok"]

        trainer_starts = [r for r in trainer if r.kind == "start"]
        worker_starts = [r for r in worker if r.event == "start"]
        # The trainer's own start line knows the step it resumed from; the instrumentation's does not.
        self.starts: list[Beat] = trainer_starts or worker_starts
        self.step_source, steps = _step_records(trainer, worker)
        beats = sorted(
            [r for r in trainer if r.kind == "progress"] + [r for r in worker if r.event in WORKER_BEATS],
            key=lambda r: r.t,
        )
        # Each kind of start is written before its own process's first beat of the same kind (the
        # trainer may call a collective before its start line), so only those split cohorts.
        own_beats = [r.t for r in beats if isinstance(r, TrainerRecord) == bool(trainer_starts)]
        cohorts = _cohorts(self.starts, own_beats, self.agent, self.docker)
        cohort_times = [c.t for c in cohorts]

        def zombie(record: Beat) -> bool:
            return _is_zombie(record, cohorts, cohort_times)

        self.zombies = [r for r in beats if zombie(r)]
        self.progress: list[Beat] = [r for r in steps if not zombie(r)]
        self.progress_times = [r.t for r in self.progress]
        self.beats: list[Beat] = [r for r in beats if not zombie(r)]
        self.beat_times = [r.t for r in self.beats]
        # Recovery is timed to the first *step* of the new round; a script that never steps
        # (collectives only) to its first collective call.
        stepping = [r for r in self.beats if isinstance(r, TrainerRecord) or r.event in STEP_EVENTS]
        self.step_beats = stepping or self.beats
        self.step_beat_times = [r.t for r in self.step_beats]
        if self.step_source != "trainer":
            cohorts = [
                dataclasses.replace(c, resumed_from=self._derived_resume(c.t, times_after(cohort_times, i)))
                for i, c in enumerate(cohorts)
            ]
        self.cohorts = cohorts
        self.cohort_times = cohort_times
        # Checkpoints written: the shipped trainer's "checkpoint" lines, and "save"s to a named file (any script),
        # a save that its process then renamed (an atomic write) under its final name only.
        saves = [r for r in worker if r.event == "save"]
        renamed = {(r.pid, r.began) for r in saves if r.op in ("os.replace", "os.rename")}
        saves = [r for r in saves if r.op in ("os.replace", "os.rename") or (r.pid, r.began) not in renamed]
        writes = [r for r in trainer if r.kind == "checkpoint"] + saves
        self.checkpoint_writes: list[Beat] = sorted((r for r in writes if r.path), key=lambda r: r.t)
        nodes = {r.node for r in trainer + worker + self.agent}
        nodes |= {r.node for r in self.docker if AGENT_CONTAINER.match(str(r.node))}
        self.agent_nodes = sorted(nodes - {None}, key=node_order)

    def _derived_resume(self, t: float, stop: float) -> int | None:
        """For a step source other than the trainer: the step before the first step in (t, stop)."""
        if self.step_source not in ABSOLUTE_STEP_SOURCES:
            return None
        first = [r.step for r in self.progress if t < r.t < stop]
        return min(first) - 1 if first else None

    # --- the run's own records ---

    @property
    def spec_fields(self) -> RecordedSpec:
        """The ClusterSpec fields the run start record gives (every field None without one)."""
        return self.start.spec_fields if self.start else RecordedSpec()

    @property
    def spec_nodes(self) -> int | None:
        """How many nodes the run started with, per its spec; None where the spec does not say
        (or says something no cluster could be, such as 10**30)."""
        count = self.spec_fields.nodes
        return count if isinstance(count, int) and 0 <= count <= MAX_SPEC_NODES else None

    @property
    def env(self) -> dict[str, str]:
        """The agents' extra environment (`up --env`)."""
        return {k: str(v) for k, v in self.spec_fields.pairs["env"].items()}

    # --- what could be measured ---

    @property
    def steps_known(self) -> bool:
        """Steps are numbered across restarts (a resume carries on from the checkpoint's step)."""
        return self.step_source in ABSOLUTE_STEP_SOURCES

    # --- whether it trained at all (no PASS without it) ---

    @property
    def trained(self) -> bool:
        """Training was seen: an optimizer step, a collective call (the instrumentation wraps them once the
        process group is set up), a step line of the script's or the shipped trainer's."""
        return bool(self.beats or self.zombies)

    @property
    def step_lines_expected(self) -> bool:
        """Step lines would show training even without the instrumentation: a progress regex, or the shipped
        trainer's own lines (a script's silence with neither, and the instrumentation off, says nothing)."""
        spec = self.spec_fields
        return bool(spec.progress_regex) or ("script" in spec.as_written and spec.script is None)

    def worker_exits(self) -> dict[tuple, int | None]:
        """Each worker process's exit code as the instrumentation saw it ((node, rank, restart) -> its last
        exit record's code), in node and rank order."""
        exits: dict[tuple, int | None] = {}
        for record in self.records:
            if isinstance(record, WorkerRecord) and record.event == "exit":
                exits[(record.node, record.rank, record.restart)] = record.code
        return dict(sorted(exits.items(), key=lambda item: (node_order(item[0][0] or ""), str(item[0][1]))))

    @property
    def losses_known(self) -> bool:
        return any(r.loss is not None for r in self.progress)

    # --- time queries ---

    def first_step_after(self, t: float) -> Beat | None:
        """The first step (or, for a script that never steps, the first beat) after t."""
        return _first_after(self.step_beats, self.step_beat_times, t)

    def last_beat_before(self, t: float) -> Beat | None:
        index = bisect.bisect_left(self.beat_times, t)
        return self.beats[index - 1] if index > 0 else None

    def beats_between(self, after: float, before: float) -> bool:
        return _any_between(self.beat_times, after, before)

    def highest_step_before(self, t: float) -> int | None:
        steps = [r.step for r in self.progress[: bisect.bisect_left(self.progress_times, t)]]
        return max(steps) if steps else None

    def first_cohort_after(self, t: float) -> Cohort | None:
        return _first_after(self.cohorts, self.cohort_times, t)

    def cohort_at(self, t: float) -> Cohort | None:
        """The newest cohort started at or before t."""
        index = self.cohort_index(t)
        return self.cohorts[index] if index >= 0 else None

    def cohort_index(self, t: float) -> int:
        """Which cohort was current at t: -1 before the first."""
        return bisect.bisect_right(self.cohort_times, t) - 1

    def progress_between(self, after: float, before: float) -> list[Beat]:
        return self.progress[
            bisect.bisect_right(self.progress_times, after) : bisect.bisect_left(self.progress_times, before)
        ]

    def is_zombie(self, record: Beat) -> bool:
        """Written by a worker of a round the job had left by then (see _is_zombie)."""
        return _is_zombie(record, self.cohorts, self.cohort_times)

    def world_at(self, record: Beat) -> int | None:
        """A beat's world size: its own, else its cohort's (log-matched progress has none)."""
        if isinstance(record.world_size, int):
            return record.world_size
        cohort = self.cohort_at(record.t)
        return cohort.world_size if cohort else None

    @property
    def resumes(self) -> list[Resume]:
        """Every start after the first: the cohorts; where no worker reports its start, the rounds
        of the agents' group starts (what a script's own progress lines then run between)."""
        if self.cohorts:
            return [Resume(c.t, c.resumed_from, times_after(self.cohort_times, i)) for i, c in enumerate(self.cohorts)][
                1:
            ]
        rounds = _rounds_of([r.t for r in self.agent if r.event == "group_started"])
        return [
            Resume(t, self._derived_resume(t, times_after(rounds, i)), times_after(rounds, i))
            for i, t in enumerate(rounds)
        ][1:]

    def agent_events(self, *events: str, node: str | None = None) -> list[AgentRecord]:
        return [r for r in self.agent if r.event in events and (node is None or r.node == node)]

    # --- faults ---

    def healed_at(self, fault: FaultEvent) -> float | None:
        """When a reversible fault (pause, partition, link) was undone; None: never."""
        return next((h.t_ok for h in self.heals if h.t_ok >= fault.t_ok and h.heals(fault)), None)

    # --- the job and its nodes ---

    def finished(self, target_steps: int | None) -> Record | None:
        """The record that says the job reached its end, if any: the trainer's summary at the
        target step; for any other script, the first agent whose workers all finished."""
        if self.summaries or (target_steps is not None and self.step_source == "trainer"):
            return next((s for s in self.summaries if target_steps is None or s.final_step == target_steps), None)
        return next((r for r in self.agent if r.event == "group_finished"), None)

    @property
    def t_training_ended(self) -> float:
        if self.summaries:
            return self.summaries[0].t
        done = next((r for r in self.agent if r.event == "group_finished"), None)
        return done.t if done else math.inf

    @property
    def highest_step(self) -> int | None:
        return max((r.step for r in self.progress), default=None)

    def trained_on(self, node: str) -> tuple[Beat, Beat] | None:
        """(the first, the last) of `node`'s steps after the last fault, when its steps advanced after it up to the
        run's stop (within TRAINED_TO_END_S): a node still running that trained on, not one that hung."""
        since = self.faults[-1].t_ok if self.faults else self.t_begin
        beats = [b for b in self.progress if b.node == node and b.t > since and b.step is not None]
        if len(beats) < 2 or beats[-1].step <= beats[0].step or self.t_stopped - beats[-1].t > TRAINED_TO_END_S:
            return None
        return beats[0], beats[-1]

    def lifecycle(self, node: str) -> DockerRecord | None:
        """The node container's last docker start or die record."""
        events = [r for r in self.docker if r.node == node and r.action in ("start", "die")]
        return events[-1] if events else None

    def refused_at_end(self) -> dict[str, AgentRecord]:
        """Nodes whose agent came to join a round after another node's worker group had finished: the finished
        agents closed the rendezvous, so torch's join gave RendezvousClosedError and the agent exited 1 (a node
        that joined, or came back from a fault, as the job ended). Node -> its rdzv_closed record."""
        finished = [r for r in self.agent if r.event == "group_finished"]
        refused: dict[str, AgentRecord] = {}
        for closed in self.agent_events("rdzv_closed"):
            node = closed.node
            if node is None or node in refused or any(r.node == node for r in finished):
                continue  # it finished: the closed rendezvous is its own end of the job
            if not any(r.node != node and r.t <= closed.t for r in finished):
                continue  # closed before anyone finished: not the job's end
            if any(r.event == "group_started" and r.node == node and r.t > closed.t for r in self.agent):
                continue  # it trained again afterwards
            refused[node] = closed
        return refused

    def removed_on_purpose(self) -> dict[str, FaultEvent]:
        """Nodes a fault took out (kill/stop, scale-down) and that never started again."""
        removed = {}
        for fault in self.faults:
            if fault.kind.removes_node:
                nodes = [fault.where]
            elif fault.kind.changes_node_count:
                nodes = list(fault.result.left or ())
            else:
                continue
            for node in nodes:
                restarted = any(r.node == node and r.action == "start" and r.t > fault.t_invoke for r in self.docker)
                if not restarted:
                    removed[node] = fault
        return removed

    def restarts_per_node(self, max_restarts: int) -> dict[str, int]:
        """Restarts each agent used (torch counts them per agent), in node order: from the agents'
        "k/m attempts left" lines, and from the restart count the workers see."""
        used: dict[str, int] = {}

        def seen(node: str | None, count: int | None) -> None:
            if node is not None and count is not None:
                used[node] = max(used.get(node, 0), count)

        for record in self.agent:
            seen(record.node, record.restarts_used(max_restarts))
        for record in self.starts + self.beats:  # TORCHELASTIC_RESTART_COUNT
            seen(record.node, record.restart or 0)
        return {node: used[node] for node in sorted(used, key=node_order)}


def trigger_step(record: Record) -> int | None:
    """The step a chaos `step` trigger compares with, or None for a record that is no training step
    (a shipped-trainer progress line, the script's own progress, an optimizer step the instrumentation
    saw): absolute where known, else the optimizer steps this worker process took."""
    if isinstance(record, TrainerRecord):
        return record.step if record.kind == "progress" else None
    if isinstance(record, WorkerRecord) and record.event in STEP_EVENTS:
        return record.step if record.step is not None else record.n or 0
    return None


def times_after(times: list[float], index: int) -> float:
    """The time after times[index] (infinity after the last)."""
    return times[index + 1] if index + 1 < len(times) else math.inf


def _first_after(items: list, times: list[float], t: float):
    index = bisect.bisect_right(times, t)
    return items[index] if index < len(items) else None


def _rounds_of(times: list[float]) -> list[float]:
    """Start times grouped into rounds: the first of each run of starts ROUND_GAP_S or less apart."""
    rounds, previous = [], None
    for t in times:
        if previous is None or t - previous > ROUND_GAP_S:
            rounds.append(t)
        previous = t
    return rounds


def _step_records(trainer: list[TrainerRecord], worker: list[WorkerRecord]) -> tuple[str, list[Beat]]:
    """(step source, its progress records, each with an int step), richest source first."""
    progress: list[Beat] = [r for r in trainer if r.kind == "progress" and r.step is not None]
    if progress:
        return "trainer", progress
    progress = [r for r in worker if r.event == "progress" and r.step is not None]
    if progress:
        return "script", progress
    steps = [r for r in worker if r.event == "step" and r.n is not None]
    if not steps:
        return "none", []
    if all(r.step is not None for r in steps):
        return "optimizer", steps
    return "optimizer-relative", [dataclasses.replace(r, step=r.n) for r in steps]


def _is_zombie(record: Beat, cohorts: list[Cohort], cohort_times: list[float]) -> bool:
    """Written by a worker of an older round after a newer round's workers started: its node is
    not in the round running now, or it reports another world size. (An agent stops its own
    workers before it joins a new round, so only a node left out of the round, a frozen one,
    can still have workers of the old round.)"""
    index = bisect.bisect_right(cohort_times, record.t)
    if index == 0:
        return False
    current = cohorts[index - 1]
    if record.node not in current.nodes:
        return True
    world = record.world_size
    return isinstance(world, int) and isinstance(current.world_size, int) and world != current.world_size


# A node's last step this close to the run's stop: it was still training when the run ended (steps a few seconds
# apart, the harness's own pause between its last step and the stop)
TRAINED_TO_END_S = 30.0


def _teardown_start(records: list[Record]) -> float | None:
    """When `down` began: the first docker kill of a node container that no fault operation
    explains. A safety net: down() writes the run "end" record before it removes the
    containers, but a history cut short (a killed harness) may have no end record."""
    in_progress, operations = {}, []  # op -> invoke time; (invoke, outcome) times
    for record in records:
        if isinstance(record, FaultRecord):
            if record.phase == "invoke":
                in_progress[record.op] = record.t
            elif record.op in in_progress:
                operations.append((in_progress.pop(record.op), record.t))
        elif (
            isinstance(record, DockerRecord)
            and record.action == "kill"
            and AGENT_CONTAINER.match(str(record.node))
            and not in_progress
            and not any(begin <= record.t <= end for begin, end in operations)
        ):
            return record.t
    return None


def _faults(records: list[Record]) -> tuple[list[FaultEvent], list[FaultEvent]]:
    """(faults that took effect, heal operations that did), in time order: `ok` records, and
    `info` ones (outcome unknown: it may have happened) for faults."""
    invoked, faults, heals = {}, [], []
    for record in records:
        if not isinstance(record, FaultRecord):
            continue
        if record.phase == "invoke":
            invoked[record.op] = record.t
        elif record.phase in ("ok", "info"):
            fault = FaultEvent(
                op=record.op,
                fault=record.fault,
                target=record.target,
                t_invoke=invoked.get(record.op, record.t),
                t_ok=record.t,
                result=record.outcome,
                outcome=record.phase,
            )
            if not fault.kind.undoes:
                faults.append(fault)
            elif fault.outcome == "ok":
                heals.append(fault)
    return faults, heals


def _cohorts(
    starts: list[Beat], beat_times: list[float], agent: list[AgentRecord], docker: list[DockerRecord]
) -> list[Cohort]:
    """Group start records into cohorts.

    A start opens a new cohort when its world size differs from the current
    cohort's, when it comes more than COHORT_GAP_S after the previous start,
    or when a beat or a later round's rendezvous lies between the two: every worker
    starts before its group's first collective, so no beat of its own group (and no
    rendezvous of a later round) can fall inside one cohort.
    """
    rendezvous = [r for r in agent if r.event in RENDEZVOUS_EVENTS]
    rendezvous_times = [r.t for r in rendezvous]
    # What ends a node's round (or shows it spawned its workers): its agent's words, its container's restart.
    spawned: list[Record] = [r for r in agent if r.event in ROUND_SPAWNED_EVENTS]
    spawned += [r for r in docker if r.action in ("die", "start")]
    groups: list[list[Beat]] = []
    for start in starts:
        if groups and _same_cohort(groups[-1], start, beat_times, rendezvous, rendezvous_times, spawned):
            groups[-1].append(start)
        else:
            groups.append([start])
    return [Cohort(tuple(group), min(getattr(s, "resumed_from", None) or 0 for s in group)) for group in groups]


def _same_cohort(
    group: list[Beat],
    start: Beat,
    beat_times: list[float],
    rendezvous: list[AgentRecord],
    rendezvous_times: list[float],
    spawned: list[Record],
) -> bool:
    previous = group[-1]
    if start.world_size != group[0].world_size or start.t - previous.t > COHORT_GAP_S:
        return False
    if _any_between(beat_times, previous.t, start.t):
        return False
    if any(s.node == start.node and s.local_rank == start.local_rank for s in group):
        return False  # one round starts each local rank of a node once
    # The agents of one round log their own rendezvous at their own pace: a slower agent's
    # record can come after a faster node's worker started. And an agent's lines are stamped
    # when Docker reads them, a worker's records by the worker itself: a node's own rendezvous
    # of this round can be stamped after its worker's start (the agent's line read late). So a
    # node that already started a worker here shows a new round only by a rendezvous that
    # follows its agent's spawn of this round or that round's end; another node, by a higher round.
    first = bisect.bisect_right(rendezvous_times, previous.t)
    last = bisect.bisect_left(rendezvous_times, start.t)
    started = {s.node: s.t for s in reversed(group)}  # each node's first start here
    round_now = max((r.round for r in rendezvous[:first] if r.round is not None and r.t <= group[0].t), default=None)
    others = []
    for record in rendezvous[first:last]:
        if record.node not in started:
            others.append(record)
        elif any(s.node == record.node and started[record.node] < s.t < record.t for s in spawned):
            return False
        elif record.round is not None:  # its own round's, stamped late
            round_now = record.round if round_now is None else max(round_now, record.round)
    return not any(r.round is not None and round_now is not None and r.round > round_now for r in others)


def _any_between(sorted_times: list[float], after: float, before: float) -> bool:
    return bisect.bisect_left(sorted_times, before) > bisect.bisect_right(sorted_times, after)


def clock(t: float) -> str:
    """Wall-clock time of day, UTC (as `docker logs --timestamps` prints it)."""
    return datetime.fromtimestamp(t, timezone.utc).strftime("%H:%M:%S")  # a time the history holds: no clock read
