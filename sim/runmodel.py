"""The run model: a run's history read once into the facts the checkers and the report share.

A pure function of the history (records as in sim/verdict.py): nothing here reads files,
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
killing the containers still running) is ignored.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import re
import time
from typing import Sequence

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


@dataclasses.dataclass(frozen=True)
class Fault:
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
        return f"{self.fault} {where} at {clock(self.t_ok)}" if where else f"{self.fault} at {clock(self.t_ok)}"

    @property
    def heal_id(self) -> str | None:
        """The id a heal names this fault by (chaos/nemesis.py's fault ids)."""
        if self.fault in ("pause", "link"):
            return f"{self.fault}-{self.node or self.target}"
        if self.fault == "partition":
            return self.result.get("id")
        return None

    def heals(self, fault: "Fault") -> bool:
        """Whether this heal operation undid `fault`."""
        if self.fault == "unpause":
            return fault.heal_id == f"pause-{self.node or self.target}"
        return self.target in (fault.heal_id, "all") or fault.heal_id in (self.result.get("healed") or ())


@dataclasses.dataclass(frozen=True)
class Cohort:
    starts: tuple[dict, ...]  # "start" records (trainer or worker), in time order
    # The step training resumed from (worst case over the ranks); None where the step source
    # cannot tell (no steps, or steps counted per process).
    resumed_from: int | None = 0

    @property
    def t(self) -> float:
        return self.starts[0]["t"]

    @property
    def world_size(self) -> int | None:
        return self.starts[0].get("world_size")

    @property
    def nodes(self) -> frozenset:
        return frozenset(s.get("node") for s in self.starts)


class RunModel:
    """The facts checkers and the report share, read from the history sorted by time and cut at the run's end."""

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
        worker = [r for r in records if r.get("type") == "worker"]
        self.summaries = [r for r in trainer if r.get("kind") == "summary"]
        self.agent = [r for r in records if r.get("type") == "agent"]
        self.docker = [r for r in records if r.get("type") == "docker"]
        self.faults, self.heals = _faults(records)

        trainer_starts = [r for r in trainer if r.get("kind") == "start"]
        worker_starts = [r for r in worker if r.get("event") == "start"]
        # The trainer's own start line knows the step it resumed from; the instrumentation's does not.
        self.starts = trainer_starts or worker_starts
        self.step_source, steps = _step_records(trainer, worker)
        beats = sorted([r for r in trainer if r.get("kind") == "progress"]
                       + [r for r in worker if r.get("event") in WORKER_BEATS], key=lambda r: r["t"])
        # Each kind of start is written before its own process's first beat of the same kind (the
        # trainer may call a collective before its start line), so only those split cohorts.
        own_beats = [r["t"] for r in beats if (r.get("type") == "trainer") == bool(trainer_starts)]
        cohorts = _cohorts(self.starts, own_beats,
                           [r["t"] for r in self.agent if r.get("event") in RENDEZVOUS_EVENTS])
        cohort_times = [c.t for c in cohorts]

        def zombie(record: dict) -> bool:
            return _is_zombie(record, cohorts, cohort_times)

        self.zombies = [r for r in beats if zombie(r)]
        self.progress = [r for r in steps if not zombie(r)]
        self.progress_times = [r["t"] for r in self.progress]
        self.beats = [r for r in beats if not zombie(r)]
        self.beat_times = [r["t"] for r in self.beats]
        # Recovery is timed to the first *step* of the new round; a script that never steps
        # (collectives only) to its first collective call.
        stepping = [r for r in self.beats if r.get("type") == "trainer" or r.get("event") in ("step", "progress")]
        self.step_beats = stepping or self.beats
        self.step_beat_times = [r["t"] for r in self.step_beats]
        if self.step_source != "trainer":
            cohorts = [dataclasses.replace(c, resumed_from=self._derived_resume(c, cohorts, i))
                       for i, c in enumerate(cohorts)]
        self.cohorts = cohorts
        self.cohort_times = cohort_times
        nodes = {r.get("node") for r in trainer + worker + self.agent}
        nodes |= {r.get("node") for r in self.docker if AGENT_CONTAINER.match(str(r.get("node")))}
        self.agent_nodes = sorted(nodes - {None}, key=node_order)

    def _derived_resume(self, cohort: Cohort, cohorts: list[Cohort], index: int) -> int | None:
        """For a step source other than the trainer: the step before the cohort's first step."""
        if self.step_source not in ABSOLUTE_STEP_SOURCES:
            return None
        stop = cohorts[index + 1].t if index + 1 < len(cohorts) else math.inf
        first = [r["step"] for r in self.progress if cohort.t < r["t"] < stop]
        return min(first) - 1 if first else None

    # --- what could be measured ---

    @property
    def steps_known(self) -> bool:
        """Steps are numbered across restarts (a resume carries on from the checkpoint's step)."""
        return self.step_source in ABSOLUTE_STEP_SOURCES

    @property
    def losses_known(self) -> bool:
        return any(r.get("loss") is not None for r in self.progress)

    # --- time queries ---

    def first_progress_after(self, t: float) -> dict | None:
        index = bisect.bisect_right(self.progress_times, t)
        return self.progress[index] if index < len(self.progress) else None

    def first_step_after(self, t: float) -> dict | None:
        """The first step (or, for a script that never steps, the first beat) after t."""
        index = bisect.bisect_right(self.step_beat_times, t)
        return self.step_beats[index] if index < len(self.step_beats) else None

    def last_beat_before(self, t: float) -> dict | None:
        index = bisect.bisect_left(self.beat_times, t)
        return self.beats[index - 1] if index > 0 else None

    def beats_between(self, after: float, before: float) -> bool:
        return _any_between(self.beat_times, after, before)

    def highest_step_before(self, t: float) -> int | None:
        steps = [r["step"] for r in self.progress[:bisect.bisect_left(self.progress_times, t)]]
        return max(steps) if steps else None

    def first_cohort_after(self, t: float) -> Cohort | None:
        index = bisect.bisect_right(self.cohort_times, t)
        return self.cohorts[index] if index < len(self.cohorts) else None

    def cohort_at(self, t: float) -> Cohort | None:
        """The newest cohort started at or before t."""
        index = bisect.bisect_right(self.cohort_times, t)
        return self.cohorts[index - 1] if index > 0 else None

    def cohort_index(self, t: float) -> int:
        """Which cohort was current at t: -1 before the first."""
        return bisect.bisect_right(self.cohort_times, t) - 1

    def cohort_progress(self, cohort: Cohort) -> list[dict]:
        later = self.first_cohort_after(cohort.t)
        stop = bisect.bisect_left(self.progress_times, later.t) if later else len(self.progress)
        return self.progress[bisect.bisect_right(self.progress_times, cohort.t):stop]

    def world_at(self, record: dict) -> int | None:
        """A beat's world size: its own, else its cohort's (log-matched progress has none)."""
        world = record.get("world_size")
        if isinstance(world, int):
            return world
        cohort = self.cohort_at(record["t"])
        return cohort.world_size if cohort else None

    # --- the job and its nodes ---

    def finished(self, target_steps: int | None) -> dict | None:
        """The record that says the job reached its end, if any: the trainer's summary at the
        target step; for any other script, the first agent whose workers all finished."""
        if self.summaries or (target_steps is not None and self.step_source == "trainer"):
            return next((s for s in self.summaries
                         if target_steps is None or s.get("final_step") == target_steps), None)
        return next((r for r in self.agent if r.get("event") == "group_finished"), None)

    @property
    def t_training_ended(self) -> float:
        if self.summaries:
            return self.summaries[0]["t"]
        done = next((r for r in self.agent if r.get("event") == "group_finished"), None)
        return done["t"] if done else math.inf

    @property
    def highest_step(self) -> int | None:
        return max((r.get("step", 0) for r in self.progress), default=None)

    def lifecycle(self, node: str) -> dict | None:
        """The node container's last docker start or die record."""
        events = [r for r in self.docker if r.get("node") == node and r.get("action") in ("start", "die")]
        return events[-1] if events else None

    def removed_on_purpose(self) -> dict[str, Fault]:
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


def _step_records(trainer: list[dict], worker: list[dict]) -> tuple[str, list[dict]]:
    """(step source, its progress records, each with an int "step"), richest source first."""
    progress = [r for r in trainer if r.get("kind") == "progress" and isinstance(r.get("step"), int)]
    if progress:
        return "trainer", progress
    progress = [r for r in worker if r.get("event") == "progress" and isinstance(r.get("step"), int)]
    if progress:
        return "script", progress
    steps = [r for r in worker if r.get("event") == "step" and isinstance(r.get("n"), int)]
    if not steps:
        return "none", []
    if all(isinstance(r.get("step"), int) for r in steps):
        return "optimizer", steps
    return "optimizer-relative", [{**r, "step": r["n"]} for r in steps]


def _is_zombie(record: dict, cohorts: list[Cohort], cohort_times: list[float]) -> bool:
    """Written by a worker of an older round after a newer round's workers started: its node is
    not in the round running now, or it reports another world size. (An agent stops its own
    workers before it joins a new round, so only a node left out of the round, a frozen one,
    can still have workers of the old round.)"""
    index = bisect.bisect_right(cohort_times, record["t"])
    if index == 0:
        return False
    current = cohorts[index - 1]
    if record.get("node") not in current.nodes:
        return True
    world = record.get("world_size")
    return isinstance(world, int) and isinstance(current.world_size, int) and world != current.world_size


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


def _faults(records: list[dict]) -> tuple[list[Fault], list[Fault]]:
    """(faults, heal operations) that completed (`ok`), in time order."""
    invoked, faults, heals = {}, [], []
    for record in records:
        if record.get("type") != "fault":
            continue
        if record.get("phase") == "invoke":
            invoked[record.get("op")] = record["t"]
        elif record.get("phase") == "ok":
            fault = Fault(op=record.get("op"), fault=record.get("fault"), target=record.get("target"),
                          t_invoke=invoked.get(record.get("op"), record["t"]), t_ok=record["t"],
                          result=record.get("result") or {})
            (heals if fault.fault in HEAL_OPS else faults).append(fault)
    return faults, heals


def _cohorts(starts: list[dict], beat_times: list[float], rendezvous_times: list[float]) -> list[Cohort]:
    """Group start records into cohorts.

    A start opens a new cohort when its world size differs from the current
    cohort's, when it comes more than COHORT_GAP_S after the previous start,
    or when a beat or an agent rendezvous record lies between the
    two: every worker starts before its group's first collective, so no beat of
    its own group (and no rendezvous of a later round) can fall inside one cohort.
    """
    groups: list[list[dict]] = []
    for start in starts:
        if groups and _same_cohort(groups[-1], start, beat_times, rendezvous_times):
            groups[-1].append(start)
        else:
            groups.append([start])
    return [Cohort(tuple(group), min(s.get("resumed_from") or 0 for s in group)) for group in groups]


def _same_cohort(group: list[dict], start: dict, beat_times: list[float], rendezvous_times: list[float]) -> bool:
    previous = group[-1]
    if start.get("world_size") != group[0].get("world_size") or start["t"] - previous["t"] > COHORT_GAP_S:
        return False
    return not any(_any_between(times, previous["t"], start["t"]) for times in (beat_times, rendezvous_times))


def _any_between(sorted_times: list[float], after: float, before: float) -> bool:
    return bisect.bisect_left(sorted_times, before) > bisect.bisect_right(sorted_times, after)


def clock(t: float) -> str:
    """Wall-clock time of day, UTC (as `docker logs --timestamps` prints it)."""
    return time.strftime("%H:%M:%S", time.gmtime(t))


def node_order(name: str) -> tuple[int, str]:
    digits = name[4:] if name.startswith("node") else ""
    return (int(digits) if digits.isdigit() else 10**6, name)
