"""What followed each fault and each resume: recovery time, steps lost, throughput, loss jumps.

Pure functions of the run model, shared by the checkers (sim/verdict/checkers.py), the diagnoses and
the report. Terms:
- a fault's *restart* is the first cohort started after the fault was invoked, unless training
  went on after the fault and that cohort came only after the next fault; the fault *recovered*
  at the first progress step after its restart (or, when no restart followed, the first one after
  the fault);
- a *loss jump* is the loss after a resume rising above the loss before it, beyond a relative
  tolerance and beyond the step-to-step noise seen before;
- a recovery's *phases* (RecoveryPhases) split the time from the fault to that first step at the
  milestones the history shows: an agent noticing, the rendezvous complete, torch imported in the
  new workers, their process group ready, the checkpoint loaded.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
import math

from sim.core.history import AgentRecord, TrainerRecord, WorkerRecord
from sim.verdict import FaultRecovery
from sim.verdict.runmodel import Beat, Cohort, FaultEvent, Resume, RunModel

# Throughput before and after a fault is measured over this much training.
THROUGHPUT_WINDOW_S = 10.0
# Loss jumps: steps averaged on each side of a resume, so one noisy batch does not decide; the
# steps whose wobble sets the bar; how far above that wobble a rise must be; the default tolerance.
LOSS_WINDOW = 3
NOISE_WINDOW = 10
NOISE_FACTOR = 3.0
LOSS_JUMP_TOLERANCE = 0.5  # relative: 0.5 = the loss may rise by half
# A fault that holds its workers: a silence after it longer than this (and than HELD_GAP_FACTOR times the
# longest gap between steps just before it) is the hold; the steps before that silence were in flight.
HELD_MIN_S = 3.0
HELD_GAP_FACTOR = 3.0
# Agent events that show an agent noticed a fault: its workers failed, nodes wait to join, its
# keep-alive failed, or it entered a new rendezvous (sim/core/agentlog.py).
NOTICE_EVENTS = ("worker_failed", "group_failed", "new_nodes", "keepalive_failed", "rdzv_joining")
# The instrumentation's records of a worker's way to its first step (images/node/elastic_sim_instrument.py).
WAY_EVENTS = ("imported", "pg_ready", "load")


@dataclasses.dataclass(frozen=True)
class RecoveryPhases:
    """Where a recovery's time went, in seconds, in order; None where the history cannot tell (a
    history written before these records, a script run without instrumentation, no restart).

    Each phase runs from one milestone to the next, so the known phases of a recovery that has all
    its milestones add up to its recovery time (from the fault's ok record to the first step); a
    milestone before the previous one counts as reached with it (a fault noticed before its ok).
    - detection: until every agent of the new round has noticed (a worker or group failure, new
      nodes waiting, a keep-alive failure) and entered the rendezvous, its old workers stopped (a
      frozen worker: torch's 30 s stop timeout); the agent of a node the fault took out, restarted
      or added is not one that notices;
    - rendezvous: to the last agent's rendezvous complete (joins, torch's polls, the last call);
    - worker start: spawn and `import torch` of the new workers, to the last one's import;
    - pg_init: to the last worker's init_process_group returning;
    - ckpt_load: the slowest worker's time loading the checkpoint, taken out of the phase it fell in
      (the shipped trainer: from its load's start to its start line; another script: its time in
      torch.load and torch.distributed.checkpoint's loads);
    - first_step: the rest, to the first step of the new round: building the model and optimizer
      (torch imports torch._dynamo at the first optimizer: seconds on a busy CPU) and the step.
    """

    detection_s: float | None = None
    rendezvous_s: float | None = None
    worker_start_s: float | None = None
    pg_init_s: float | None = None
    ckpt_load_s: float | None = None
    first_step_s: float | None = None

    def as_dict(self) -> dict[str, float | None]:
        return dataclasses.asdict(self)

    @property
    def known(self) -> bool:
        return any(v is not None for v in self.as_dict().values())


@dataclasses.dataclass(frozen=True)
class Recovery:
    fault: FaultEvent
    restart: Cohort | None  # the cohort the fault led to; None: training went on without a restart
    first_progress: Beat | None  # the first beat (a step, where steps are seen) after the restart or fault
    steps_before: int | None  # highest step reached before the restart (None: steps not numbered across restarts)
    resumed_from: int | None  # step the recovering cohort resumed from
    world_before: int | None
    world_after_restart: int | None
    throughput_before: float | None  # steps/s in the window before the fault
    throughput_after: float | None  # steps/s in the window after the recovery
    throughput_during: float | None = None  # steps/s while a degrading fault (straggler) was in force
    phases: RecoveryPhases = RecoveryPhases()  # where the time to the first step went
    # Compound faults: the earlier fault whose regroup was still going on when this one struck, and the later
    # fault that struck during this one's regroup (each recovery is still timed from its own fault).
    struck_during: FaultEvent | None = None
    cut_by: FaultEvent | None = None
    # A fault that holds its workers: how many steps seen after it were only in flight before training
    # stopped (not a recovery).
    in_flight: int = 0

    @property
    def degraded(self) -> bool:
        """Training went on, perhaps slower: a fault that may leave it running (_rides_on), no restart
        after it, and a step after it."""
        return _rides_on(self.fault) and self.restart is None and self.first_progress is not None

    @property
    def steps_lost(self) -> int | None:
        if self.restart is None:
            return 0 if self.first_progress else None
        if self.steps_before is None or self.resumed_from is None:
            return None
        return self.steps_before - self.resumed_from

    @property
    def world_after(self) -> int | None:
        if self.first_progress and self.world_after_restart is not None:
            return self.world_after_restart
        return self.restart.world_size if self.restart else self.world_before

    @property
    def t_recovered(self) -> float | None:
        return self.first_progress.t if self.first_progress else None

    def public(self) -> FaultRecovery:
        t_recovered = None if self.degraded else self.t_recovered
        return FaultRecovery(
            op=self.fault.op,
            fault=self.fault.fault,
            target=self.fault.target,
            t_fault=self.fault.t_ok,
            t_recovered=t_recovered,
            recovery_s=None if t_recovered is None else round(t_recovered - self.fault.t_ok, 3),
            steps_lost=self.steps_lost,
            world_before=self.world_before,
            world_after=self.world_after,
            throughput_before=self.throughput_before,
            throughput_after=self.throughput_after,
            degraded=self.degraded,
            throughput_during=self.throughput_during,
            struck_during=_label(self.struck_during),
            regroup_cut_by=_label(self.cut_by),
        )


def _label(fault: FaultEvent | None) -> str | None:
    """ "kill-worker node1": a fault as the report names it in another fault's row."""
    return None if fault is None else " ".join(part for part in (fault.fault, fault.where) if part)


def faults_during_training(run: RunModel) -> list[FaultEvent]:
    return [f for f in run.faults if f.t_invoke < run.t_training_ended]


@functools.lru_cache(maxsize=4)  # several checkers ask of one model
def recoveries(run: RunModel) -> tuple[Recovery, ...]:
    """How each fault during training was recovered from, in time order."""
    faults = faults_during_training(run)
    found = [_recovery(run, fault, faults[i + 1] if i + 1 < len(faults) else None) for i, fault in enumerate(faults)]
    return tuple(_compound(found))


def _compound(found: list[Recovery]) -> list[Recovery]:
    """Each fault that struck while an earlier fault's regroup was still going on (struck after that fault, before
    its first step of training again): marked on both, the later one `struck_during` the newest such regroup."""
    marked = list(found)
    for i, later in enumerate(found):
        earlier = [
            j
            for j in range(i)
            if _regroups(found[j])
            and found[j].fault.t_ok <= later.fault.t_invoke
            and (found[j].t_recovered is None or found[j].t_recovered > later.fault.t_invoke)
        ]
        if not earlier:
            continue
        j = earlier[-1]
        marked[i] = dataclasses.replace(marked[i], struck_during=found[j].fault)
        if marked[j].cut_by is None:
            marked[j] = dataclasses.replace(marked[j], cut_by=later.fault)
    return marked


def _regroups(recovery: Recovery) -> bool:
    """The fault makes the job regroup (its workers end or a node goes): not a fault training rides on."""
    fault = recovery.fault
    return not recovery.degraded and not _rides_on(fault) and (fault.kind.ends_workers or fault.kind.loses_node)


def _recovery(run: RunModel, fault: FaultEvent, next_fault: FaultEvent | None) -> Recovery:
    before = run.last_beat_before(fault.t_invoke)
    # Before the workers' first beat (still importing), the world they were started at.
    cohort_then = run.cohort_at(fault.t_invoke)
    world_before = run.world_at(before) if before else cohort_then.world_size if cohort_then else None
    rate_before = throughput(run, fault.t_invoke - THROUGHPUT_WINDOW_S, fault.t_invoke)
    # From the invoke: a slow fault (stop with a grace period, scale) may see the restart before its ok.
    restart = run.first_cohort_after(fault.t_invoke)
    if (
        restart
        and next_fault
        and restart.t > next_fault.t_invoke
        and not _ends_workers(fault)
        and run.beats_between(fault.t_ok, next_fault.t_invoke)
    ):
        restart = None  # training went on after this fault; the restart belongs to a later one
    first = run.first_step_after(max(restart.t, fault.t_ok) if restart else fault.t_ok)
    if restart is None and _ends_workers(fault) and run.cohorts:
        # torch restarts a group whose worker ended: with no restart seen, a step after the fault is one still
        # in flight in the ending group, not a recovery (where starts are seen; else no restart can be told).
        first = None
    in_flight = 0
    if restart is None and fault.kind.holds_workers and not _rides_on(fault):
        window_end = next_fault.t_invoke if next_fault else run.t_end
        in_flight, first = _past_in_flight(run, fault, window_end)
    # What tells where the recovery went lies before its first step (else the next fault, the run's end).
    phases_end = first.t if first else next_fault.t_invoke if next_fault else run.t_end
    world_after = run.world_at(first) if first else None
    rate_after = throughput(run, first.t, first.t + THROUGHPUT_WINDOW_S) if first else None
    if restart is None:
        during = None
        if _rides_on(fault):
            healed = run.healed_at(fault)
            until = healed if healed is not None else min(run.t_training_ended, run.t_end)
            during = throughput(run, fault.t_ok, until)
            rate_after = throughput(run, healed, healed + THROUGHPUT_WINDOW_S) if healed is not None else None
        phases = recovery_phases(run, fault, None, first, phases_end)
        return Recovery(
            fault,
            None,
            first,
            None,
            None,
            world_before,
            world_after,
            rate_before,
            rate_after,
            during,
            phases,
            in_flight=in_flight,
        )
    recovering = run.cohort_at(first.t) if first else restart
    steps_before = run.highest_step_before(restart.t) if run.steps_known else None
    return Recovery(
        fault,
        restart,
        first,
        steps_before,
        recovering.resumed_from,
        world_before,
        world_after,
        rate_before,
        rate_after,
        phases=recovery_phases(run, fault, recovering, first, phases_end),
    )


def _past_in_flight(run: RunModel, fault: FaultEvent, window_end: float) -> tuple[int, Beat | None]:
    """(the step records in flight after a fault that holds its workers, the first step of steady training after
    the hold): a worker held before its next collective, or frozen, still finishes the step it was in and its
    peers log theirs, then every rank waits. So the steps after the fault up to the first silence longer than
    the hold's mark (or, for a hold undone sooner, the gap across its undo) were in flight, and training went on
    only at the first step after that silence (None: the silence lasted to the next fault or the run's end). No
    such silence: the hold never stopped training."""
    before = run.step_beats[
        bisect.bisect_left(run.step_beat_times, fault.t_invoke - THROUGHPUT_WINDOW_S) : bisect.bisect_left(
            run.step_beat_times, fault.t_invoke
        )
    ]
    usual = max((b.t - a.t for a, b in itertools.pairwise(before)), default=0.0)
    held_s = max(HELD_MIN_S, HELD_GAP_FACTOR * usual)
    after = run.step_beats[
        bisect.bisect_right(run.step_beat_times, fault.t_ok) : bisect.bisect_left(run.step_beat_times, window_end)
    ]
    # A short hold shows where it was undone: a gap across the heal, longer than the steps' usual one, is the hold.
    healed = run.healed_at(fault)
    last = fault.t_ok
    for index, beat in enumerate(after):
        across_heal = healed is not None and last < healed <= beat.t and beat.t - last > HELD_GAP_FACTOR * usual
        if beat.t - last > held_s or across_heal:
            return _steps(after[:index]), beat
        last = beat.t
    if window_end - last > held_s:
        return _steps(after), None
    return 0, after[0] if after else None


def _steps(beats: list[Beat]) -> int:
    """How many steps these records (of every rank) are: by step number, else one each."""
    return len({b.step for b in beats}) if all(b.step is not None for b in beats) else len(beats)


def _rides_on(fault: FaultEvent) -> bool:
    """A fault training may go on through: a straggler, a slow link, a skewed clock, or one that spares
    every training node (etcd lost while no rendezvous runs, etcd cut off from a node)."""
    return fault.kind.degrading or fault.spares_training


def _ends_workers(fault: FaultEvent) -> bool:
    """A worker-ending fault on a training node (kill-node of etcd ends none: training rides it out). torch
    must restart the group: the first restart after one is its own, even when a later fault came first
    (steps already in flight at the kill do not mean training went on)."""
    return fault.kind.ends_workers and not fault.spares_training


def recovery_phases(
    run: RunModel, fault: FaultEvent, cohort: Cohort | None, first: Beat | None, until: float
) -> RecoveryPhases:
    """The phases of the recovery from `fault` by the workers of `cohort` (None: no worker said when
    it started), from the records up to `until` (the first step, else the next fault or the run's end)."""
    agents = [r for r in run.agent if fault.t_invoke < r.t <= until]
    completed = {r.node: r.t for r in agents if r.event == "rdzv_complete"}  # each agent's last
    silent = _silenced_nodes(fault)
    way = [r for r in _way_records(run) if fault.t_invoke < r.t <= until]
    starts = cohort.starts if cohort else ()
    processes = {(s.node, s.pid) for s in starts if s.pid is not None}
    if processes:
        way = [r for r in way if (r.node, r.pid) in processes]
    trainer = [s for s in starts if isinstance(s, TrainerRecord)]

    def latest(event: str, trainer_field: str) -> float | None:
        times = [r.t for r in way if r.event == event] or [getattr(s, trainer_field) for s in trainer]
        return max(times) if times and None not in times else None

    pg_ready = latest("pg_ready", "t_pg_ready")
    milestones = _monotone(
        [
            fault.t_ok,
            _noticed([r for r in agents if r.node not in silent], set(completed) - silent),
            max(completed.values(), default=None),
            latest("imported", "t_imported"),
            pg_ready,
            first.t if first else None,
        ]
    )
    detection, rendezvous, worker_start, pg_init, after_pg = [_span(a, b) for a, b in itertools.pairwise(milestones)]
    loads = _trainer_load_seconds(trainer) or (_load_seconds(way, pg_ready) if way else None)
    if loads is None:  # loading not told from the rest
        return RecoveryPhases(detection, rendezvous, worker_start, pg_init)
    before, total = loads  # out of the phases they fell in
    pg_init = None if pg_init is None else round(max(0.0, pg_init - before), 3)
    first_step = None if after_pg is None else round(max(0.0, after_pg - (total - before)), 3)
    return RecoveryPhases(detection, rendezvous, worker_start, pg_init, round(total, 3), first_step)


def _noticed(agents: list[AgentRecord], regrouped: set[str]) -> float | None:
    """When the last agent of the new round had noticed the fault and entered the rendezvous (its first
    rdzv_joining, else its first other sign of noticing); with no such agent, when the first one noticed."""
    first_sign: dict[str, float] = {}
    joining: dict[str, float] = {}
    for record in agents:  # in time order
        if record.event in NOTICE_EVENTS:
            first_sign.setdefault(record.node, record.t)
            if record.event == "rdzv_joining":
                joining.setdefault(record.node, record.t)
    entered = [joining.get(node, first_sign.get(node)) for node in regrouped]
    return max((t for t in entered if t is not None), default=min(first_sign.values(), default=None))


def _silenced_nodes(fault: FaultEvent) -> set[str]:
    """Nodes whose agents do not count as noticing this fault: taken out, restarted, frozen or added by it
    (their own node's agent is not the one that notices)."""
    nodes = {fault.where} if fault.kind.silences_node else set()
    if fault.kind.changes_node_count:
        nodes |= set(fault.result.joined or ()) | set(fault.result.left or ())
    return nodes


@functools.lru_cache(maxsize=4)
def _way_records(run: RunModel) -> list[WorkerRecord]:
    return [r for r in run.records if isinstance(r, WorkerRecord) and r.event in WAY_EVENTS]


def _trainer_load_seconds(starts: list[TrainerRecord]) -> tuple[float, float] | None:
    """(0, the slowest rank's checkpoint load) of the shipped trainer: each start line ends its load and
    says when the load began (after the process group was ready); None without them (older trainers)."""
    if not starts or any(s.t_ckpt_began is None for s in starts):
        return None
    return 0.0, max(s.t - s.t_ckpt_began for s in starts)


def _load_seconds(way: list[WorkerRecord], pg_ready: float | None) -> tuple[float, float]:
    """(seconds loading before the process group was ready, seconds loading in all) of the worker
    that spent the most in checkpoint loads: each "load" record holds its process's total so far."""
    totals: dict[tuple, tuple[float, float]] = {}
    for record in way:  # in time order
        if record.event == "load" and record.seconds is not None:
            before, _ = totals.get((record.node, record.pid), (0.0, 0.0))
            if pg_ready is None or record.t <= pg_ready:
                before = record.seconds
            totals[(record.node, record.pid)] = (before, record.seconds)
    return max(totals.values(), key=lambda pair: pair[1], default=(0.0, 0.0))


def _monotone(times: list[float | None]) -> list[float | None]:
    """Each known milestone at or after the known ones before it."""
    result, floor = [], -math.inf
    for t in times:
        if t is not None:
            floor = t = max(t, floor)
        result.append(t)
    return result


def _span(begin: float | None, end: float | None) -> float | None:
    return None if begin is None or end is None else round(end - begin, 3)


def throughput(run: RunModel, begin: float, end: float) -> float | None:
    """Steps per second in [begin, end) on one rank (rank 0, or the script's own rank-less
    progress lines): the steps gained over the time they took, cohort by cohort. Step numbers,
    not record counts: the instrumentation writes a step record at most twice a second."""
    index = bisect.bisect_left(run.progress_times, begin)
    spans: dict[int, list[Beat]] = {}
    for record in run.progress[index : bisect.bisect_left(run.progress_times, end)]:
        if record.rank in (0, None):
            spans.setdefault(run.cohort_index(record.t), []).append(record)
    steps = sum(max(r.step for r in span) - min(r.step for r in span) for span in spans.values())
    seconds = sum(span[-1].t - span[0].t for span in spans.values())
    return round(steps / seconds, 3) if steps > 0 and seconds > 0 else None


# ---------------------------------------------------------------- the loss across each resume


@dataclasses.dataclass(frozen=True)
class LossJump:
    """The loss before and after one resume (step -> the progress record that reported it)."""

    resume: Resume
    before: dict[int, Beat]
    after: dict[int, Beat]
    noise: float  # mean step-to-step change before the resume
    tolerance: float

    @property
    def mean_before(self) -> float:
        return _mean(r.loss for r in self.before.values())

    @property
    def mean_after(self) -> float:
        return _mean(r.loss for r in self.after.values())

    @property
    def relative(self) -> float:
        return (self.mean_after - self.mean_before) / max(abs(self.mean_before), 1e-12)

    @property
    def jumped(self) -> bool:
        """Minibatch losses wobble on their own (early in training by more than 50%): a rise counts only
        when it also stands out from the noise. Only a rise: the loss falling is progress, not a fault."""
        return not math.isfinite(self.mean_after) or (
            self.relative > self.tolerance and self.mean_after - self.mean_before > NOISE_FACTOR * self.noise
        )


def loss_across_resumes(run: RunModel, tolerance: float = LOSS_JUMP_TOLERANCE) -> list[LossJump]:
    """For each resume from a known step with losses on both sides: the loss before and after it."""
    found = []
    for resume in run.resumes:
        if not resume.resumed_from:
            continue  # a fresh start (or an unknown resume point): nothing to continue from
        after = _first_losses(run, resume)
        # The steps after a resume replay steps that already ran before the fault: compare
        # the same steps where possible (immune to the loss's own ups and downs), else the
        # last steps at or before the resumed one.
        replayed = _losses_before(run, resume)
        overlap = sorted(set(after) & set(replayed))
        # The first replayed step's loss comes from the restored weights before any update, so
        # it matches even when the optimizer state was lost: it takes a second replayed step.
        if len(overlap) >= 2:
            before, after = {s: replayed[s] for s in overlap}, {s: after[s] for s in overlap}
        else:
            before = {s: r for s, r in replayed.items() if s <= resume.resumed_from}
            before = {s: before[s] for s in sorted(before)[-LOSS_WINDOW:]}
        if before and after:
            found.append(LossJump(resume, before, after, _step_noise(replayed, resume.resumed_from), tolerance))
    return found


def _step_noise(losses: dict[int, Beat], up_to_step: int) -> float:
    """Mean absolute change between consecutive steps over the NOISE_WINDOW steps up to `up_to_step`."""
    steps = [s for s in sorted(losses) if s <= up_to_step][-NOISE_WINDOW:]
    diffs = [abs(losses[b].loss - losses[a].loss) for a, b in itertools.pairwise(steps) if b == a + 1]
    return _mean(diffs) if diffs else 0.0


def _losses_before(run: RunModel, resume: Resume) -> dict[int, Beat]:
    """Every step's loss as last recorded before the resume."""
    return {r.step: r for r in run.progress_between(-math.inf, resume.t) if r.loss is not None}


def _first_losses(run: RunModel, resume: Resume) -> dict[int, Beat]:
    """The first LOSS_WINDOW steps after the resume (the loss is all-reduced: any rank's will do)."""
    first: dict[int, Beat] = {}
    for record in run.progress_between(resume.t, resume.until):
        if record.loss is not None:
            first.setdefault(record.step, record)
    return {step: first[step] for step in sorted(first)[:LOSS_WINDOW]}


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)
