"""The timeline of a run, as data: what the report's picture shows (sim/verdict/plot.py draws it).

A pure function of the run model (sim/verdict/runmodel.py) and the verdict. Everything is computed in the
history's own (absolute) time; the Timeline gives seconds since the run's start, the picture's x axis.
The lanes cover the whole history, the teardown after the run's end included (`run.all_records`).
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import re
import statistics
from collections.abc import Iterable, Sequence

from sim.core.faultkinds import kind_of
from sim.core.history import AgentRecord, DockerRecord, FaultRecord, Record, RunRecord, TrainerRecord, WorkerRecord
from sim.core.nodes import node_order
from sim.verdict import FaultRecovery, Verdict
from sim.verdict.runmodel import Beat, FaultEvent, RunModel

DOCKER_DOWN = ("die", "kill", "stop", "destroy")
# Agent events after which a node has no workers until its next progress line.
AGENT_RESTARTS = ("worker_failed", "group_failed", "new_nodes")
# Lane states, in drawing order: later ones are drawn on top of earlier ones.
LANE_STATES = ("running", "restarting", "paused", "dead", "zombie", "partitioned")
ROUND_SEPARATION_S = 1.0  # rendezvous events closer than this are one round
ETCD = "etcd"

Periods = list[tuple[float, float]]


@dataclasses.dataclass(frozen=True)
class JobEnd:
    """For a run meant to fail (or hang): one fault, and how long after its invoke the agents it ended exited."""

    op: str
    fault: str
    target: str | None
    since_start_s: float
    agents_ended: int
    ended_after_s: float | None  # None: no agent's exit followed it


@dataclasses.dataclass(frozen=True)
class FaultSpan:
    start: float  # seconds since run start: the fault's invoke
    end: float  # its heal/unpause, or the end of its recovery
    label: str  # fault and target
    outcome: str = ""  # "recovered in 4.4 s, 4 steps lost", "never recovered", "agents ended 1.2 s later", or ""


@dataclasses.dataclass(frozen=True)
class Timeline:
    """What the picture shows, in seconds since run start."""

    end: float
    steps: tuple[tuple[float, int], ...]  # (t, highest step any rank reported around t)
    throughput: tuple[tuple[float, float], ...]  # (t, steps/s over the window before t)
    throughput_window_s: float
    world: tuple[tuple[float, int], ...]  # (t, trainers) at each change
    lanes: dict  # node -> state -> list of (start, end)
    faults: tuple[FaultSpan, ...]
    rounds: tuple[tuple[float, str], ...]  # (t, label) of each rendezvous round
    step_source: str = "trainer"  # sim.verdict.runmodel.STEP_SOURCES: what the step axis counts


def run_origin(run: RunModel) -> float | None:
    """The x axis starts here: the run's start record, else the first record."""
    if run.start is not None:
        return run.start.t
    return run.all_records[0].t if run.all_records else None


def build_timeline(run: RunModel, verdict: Verdict) -> Timeline:
    origin = run_origin(run)
    if origin is None:
        return Timeline(
            end=0.0, steps=(), throughput=(), throughput_window_s=1.0, world=(), lanes={}, faults=(), rounds=()
        )
    end = max(origin, run.all_records[-1].t)
    steps, throughput, window = step_series(run.progress, origin, end)
    recovery_check = verdict.result("recovery")
    # Not measurable (no training seen at all): no recovery to draw, rather than "never recovered".
    recoveries = {r.op: r for r in verdict.recoveries} if recovery_check is None or recovery_check.measured else {}
    # A run meant to fail: each fault is shaded up to the agents' exits it caused, and says so.
    job_end = {row.op: row for row in job_end_after_faults(verdict, run)}
    faults = tuple(
        _ending(_fault_span(run, fault, recoveries.get(fault.op), origin, end), job_end.get(fault.op))
        for fault in run.applied_faults
    )
    lanes = {
        name: {state: _since(periods, origin) for state, periods in states.items()}
        for name, states in node_lanes(run, end).items()
    }
    return Timeline(
        end=end - origin,
        steps=steps,
        throughput=throughput,
        throughput_window_s=window,
        world=tuple((t - origin, size) for t, size in world_series(run)),
        lanes=lanes,
        faults=faults,
        rounds=tuple((t - origin, label) for t, label in rendezvous_rounds(run)),
        step_source=run.step_source,
    )


def _since(periods: Periods, origin: float) -> Periods:
    return [(start - origin, stop - origin) for start, stop in periods]


MAX_SAMPLES = 20_000


def step_series(progress: Sequence[Beat], origin: float, end: float):
    """Highest step per small time bin (from the run's start), and the rolling throughput computed
    from it (from the run model's progress: whatever step source the script offered)."""
    end -= origin
    window = min(20.0, max(2.0, end / 15))  # wide enough to average over several steps
    if not progress:
        return (), (), window
    bin_s = max(end / 600, 0.05)  # about one bin per pixel column
    highest: dict[int, tuple[float, int]] = {}
    for record in progress:
        since = record.t - origin
        index = int(since // bin_s)
        t, step = highest.get(index, (since, record.step))
        highest[index] = (max(t, since), max(step, record.step))
    steps = tuple(highest[i] for i in sorted(highest))
    # New steps per bin; a fall back to a checkpoint counts as none, the steps redone do count.
    gains = [(t, max(0, step - previous)) for (_, previous), (t, step) in itertools.pairwise(steps)]
    gain_times = [t for t, _ in gains]
    cumulative = [0]
    for _, gain in gains:
        cumulative.append(cumulative[-1] + gain)
    throughput = []
    # Finer sampling only shows the aliasing of steps against the window; a run stretched by a broken
    # clock gets coarser samples, not millions of them.
    sample_s = max(window / 8, end / MAX_SAMPLES)
    for index in range(int(end // sample_s) + 1):
        t = index * sample_s
        new_steps = (
            cumulative[bisect.bisect_right(gain_times, t)] - cumulative[bisect.bisect_right(gain_times, t - window)]
        )
        throughput.append((t, new_steps / window))
    return steps, tuple(throughput), window


def world_series(run: RunModel) -> list[tuple[float, int]]:
    """Trainers in the job over time: from the workers' own records (zombies aside) and completed rendezvous."""
    sizes = [(r.t, r.world_size) for r in run.starts + run.beats]
    sizes += [(r.t, r.global_world_size) for r in _agent_records(run) if r.event == "rdzv_complete"]
    changes: list[tuple[float, int]] = []
    for t, size in sorted((t, s) for t, s in sizes if s is not None):
        if not changes or changes[-1][1] != size:
            changes.append((t, size))
    return changes


def rendezvous_rounds(run: RunModel) -> list[tuple[float, str]]:
    """One mark per round: every agent reports each round, so merge by round number or by time."""
    first_seen_by_round: dict[int, float] = {}
    unnumbered = []
    for record in _agent_records(run):
        if record.event == "rdzv_joined" and record.round is not None:
            first_seen_by_round.setdefault(record.round, record.t)
        elif record.event in ("rdzv_joined", "rdzv_complete"):
            unnumbered.append(record.t)
    marks = [(t, f"round {n}") for n, t in first_seen_by_round.items()]
    for t in unnumbered:
        if all(abs(t - seen) > ROUND_SEPARATION_S for seen, _ in marks):
            marks.append((t, ""))
    return sorted(marks)


def _agent_records(run: RunModel) -> list[AgentRecord]:
    """Every agent record, the teardown's included (run.agent stops at the run's end)."""
    return [r for r in run.all_records if isinstance(r, AgentRecord)]


# ---------------------------------------------------------------- faults


def job_end_after_faults(verdict: Verdict, run: RunModel) -> list[JobEnd]:
    """For a run meant to fail (or hang): each fault, and how long after its invoke the agents it ended
    exited (None: none followed it). Recovery figures say nothing there; this says how it ended."""
    failed, stalled = verdict.result("fails_cleanly"), verdict.result("stalled")
    if failed is None and stalled is None:
        return []
    ended = failed.metrics.ended if failed is not None else {}  # a hang: no agent ended
    origin = run_origin(run)
    rows = []
    for fault in run.applied_faults:
        delays = [e.since_invoke_s for e in ended.values() if e.after_op == fault.op]
        rows.append(
            JobEnd(
                op=fault.op,
                fault=fault.fault,
                target=fault.target,
                since_start_s=round(fault.t_invoke - origin, 3),
                agents_ended=len(delays),
                ended_after_s=max(delays) if delays else None,
            )
        )
    return rows


def _fault_span(
    run: RunModel, fault: FaultEvent, recovery: FaultRecovery | None, origin: float, end: float
) -> FaultSpan:
    """From the fault's invoke to its heal (reversible faults) or to the end of its recovery."""
    if fault.kind.reversible:
        span_end = run.healed_at(fault)
    elif recovery is not None:
        span_end = recovery.t_recovered
    else:
        span_end = fault.t_ok
    label = " ".join(part for part in (fault.fault, fault.target) if part)
    if fault.where not in (None, fault.target):  # "random", "rank:3": name the node it hit
        label += f" → {fault.where}"
    return FaultSpan(
        start=fault.t_invoke - origin,
        end=(end if span_end is None else span_end) - origin,
        label=label,
        outcome=_recovery_words(recovery),
    )


def _ending(span: FaultSpan, job_end: JobEnd | None) -> FaultSpan:
    if job_end is None or job_end.ended_after_s is None:
        return span
    return dataclasses.replace(
        span,
        end=max(span.end, span.start + job_end.ended_after_s),
        outcome=f"agents ended {job_end.ended_after_s:.1f} s later",
    )


def _recovery_words(recovery: FaultRecovery | None) -> str:
    if recovery is None:
        return ""
    if recovery.struck_during:  # a compound fault: said first, as the reason its figures read as they do
        return f"struck during {_kind(recovery.struck_during)}'s regroup; {_own_recovery_words(recovery)}"
    if recovery.regroup_cut_by and recovery.recovery_s is None:
        return f"never recovered: {_kind(recovery.regroup_cut_by)} struck during its regroup"
    return _own_recovery_words(recovery)


def _kind(label: str) -> str:
    """The fault's kind of a "kill-worker node1" label."""
    return label.split(" ", 1)[0]


def _own_recovery_words(recovery: FaultRecovery) -> str:
    if recovery.degraded:
        return "slowed, no restart" if kind_of(recovery.fault).slows_steps else "no restart"
    if recovery.recovery_s is None:
        return "never recovered"
    lost = "" if recovery.steps_lost is None else f", {recovery.steps_lost} steps lost"
    return f"recovered in {recovery.recovery_s:.1f} s{lost}"


# ---------------------------------------------------------------- node lanes


def lane_names(run: RunModel) -> list[str]:
    """node0, node1, ... (also those the run's spec names but that left no record), then etcd."""
    names = set()
    for record in run.all_records:
        if isinstance(record, (TrainerRecord, WorkerRecord, AgentRecord, DockerRecord)) and record.node is not None:
            names.add(record.node)
        elif isinstance(record, RunRecord) and record is run.start and run.spec_nodes is not None:
            names.update(f"node{i}" for i in range(run.spec_nodes))
        elif isinstance(record, FaultRecord) and isinstance(record.node, str):
            names.add(record.node)
    return sorted(names, key=node_order)  # etcd, not a node, after them


def node_lanes(run: RunModel, end: float) -> dict[str, dict[str, Periods]]:
    """Per node, when it was running, restarting, paused, dead, a zombie or cut off: from Docker,
    agent and worker events. A node trains while its workers show steps or collective calls; for a
    script nothing shows (no instrumentation, no progress lines), from its agent's "Starting worker
    group" until the group fails or the node goes down."""
    names = lane_names(run)
    partitioned = _partitions(run, names, end)
    docker_of = _by_node(names, (r for r in run.all_records if isinstance(r, DockerRecord)))
    agent_of = _by_node(names, _agent_records(run))
    beats_of, zombies_of = _by_node(names, run.beats), _by_node(names, run.zombies)
    lanes = {}
    for name in names:
        docker = {
            action: [r.t for r in docker_of[name] if r.action == action]
            for action in (*DOCKER_DOWN, "start", "pause", "unpause")
        }
        down = sorted(t for action in DOCKER_DOWN for t in docker[action])
        group_started = [r.t for r in agent_of[name] if r.event == "group_started"]
        # A (re)started container is joining until it trains again.
        restart_begins = docker["start"] + [r.t for r in agent_of[name] if r.event in AGENT_RESTARTS]
        if name == ETCD:  # no trainers there: it is "running" while its container is up
            running, restarting = _intervals(docker["start"], down, end), []
        elif run.beats:
            beats = beats_of[name]
            running = _running_stretches(beats, sorted(restart_begins + down + docker["pause"]))
            restarting = _intervals(restart_begins, [r.t for r in beats] + down, end)
        else:
            running = _intervals(group_started, restart_begins + down, end)
            restarting = _intervals(restart_begins, group_started + down, end)
        lanes[name] = {
            "running": running,
            "restarting": restarting,
            "paused": _intervals(docker["pause"], docker["unpause"] + down, end),
            "dead": _intervals(down, docker["start"], end),
            "zombie": _running_stretches(zombies_of[name], []),
            "partitioned": partitioned[name],
        }
    return lanes


def _by_node(names: list[str], records: Iterable[Record]) -> dict[str, list]:
    """The records of each lane's node, in the order given (records of other nodes left out)."""
    found: dict[str, list] = {name: [] for name in names}
    for record in records:
        if record.node in found:
            found[record.node].append(record)
    return found


def _intervals(opens: Iterable[float], closes: Iterable[float], end: float) -> Periods:
    """Periods from an open to the next close (repeated opens and closes are no-ops)."""
    events = sorted([(t, 0) for t in closes] + [(t, 1) for t in opens])  # a close before an open at one time
    found, since = [], None
    for t, is_open in events:
        if is_open and since is None:
            since = t
        elif not is_open and since is not None:
            found.append((since, t))
            since = None
    if since is not None:
        found.append((since, end))
    return found


def _running_stretches(beats: list[Beat], breaks: list[float]) -> Periods:
    """Periods of steady progress: split where another state began, or where progress stalled
    for much longer than a step takes (the node waits on a peer it cannot reach)."""
    if not beats:
        return []
    step_gaps = [b.t - a.t for a, b in itertools.pairwise(beats) if b.step != a.step]
    stall_s = max(2.0, 5 * statistics.median(step_gaps)) if step_gaps else 2.0
    stretches = [[beats[0].t, beats[0].t]]
    for t in (r.t for r in beats[1:]):
        last = stretches[-1][1]
        broken = bisect.bisect_right(breaks, last) < bisect.bisect_right(breaks, t)  # a break in (last, t]
        if t - last > stall_s or broken:
            stretches.append([t, t])
        else:
            stretches[-1][1] = t
    return [(start, stop) for start, stop in stretches]


def _partitions(run: RunModel, names: list[str], end: float) -> dict[str, Periods]:
    """Node -> periods it was on a side of a partition (the fault's target names the nodes)."""
    cut: dict[str, Periods] = {name: [] for name in names}
    for fault in run.faults:
        if fault.kind.lane != "partitioned":
            continue
        healed = run.healed_at(fault)
        text = " ".join(str(part) for part in (fault.target, fault.result.partition))
        for name in names:
            if re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text):
                cut[name].append((fault.t_ok, end if healed is None else healed))
    return cut
