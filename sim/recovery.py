"""What followed each fault and each resume: recovery time, steps lost, throughput, loss jumps.

Pure functions of the run model, shared by the checkers (sim/checkers.py), the diagnoses and
the report. Terms:
- a fault's *restart* is the first cohort started after the fault was invoked, unless training
  went on after the fault and that cohort came only after the next fault; the fault *recovered*
  at the first progress step after its restart (or, when no restart followed, the first one after
  the fault);
- a *loss jump* is the loss after a resume rising above the loss before it, beyond a relative
  tolerance and beyond the step-to-step noise seen before.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
import math

from .runmodel import DEGRADING_FAULTS, Beat, Cohort, Fault, Resume, RunModel
from .verdict import FaultRecovery

# Throughput before and after a fault is measured over this much training.
THROUGHPUT_WINDOW_S = 10.0
# Loss jumps: steps averaged on each side of a resume, so one noisy batch does not decide; the
# steps whose wobble sets the bar; how far above that wobble a rise must be; the default tolerance.
LOSS_WINDOW = 3
NOISE_WINDOW = 10
NOISE_FACTOR = 3.0
LOSS_JUMP_TOLERANCE = 0.5  # relative: 0.5 = the loss may rise by half


@dataclasses.dataclass(frozen=True)
class Recovery:
    fault: Fault
    restart: Cohort | None  # the cohort the fault led to; None: training went on without a restart
    first_progress: Beat | None  # the first beat (a step, where steps are seen) after the restart or fault
    steps_before: int | None  # highest step reached before the restart (None: steps not numbered across restarts)
    resumed_from: int | None  # step the recovering cohort resumed from
    world_before: int | None
    world_after_restart: int | None
    throughput_before: float | None  # steps/s in the window before the fault
    throughput_after: float | None  # steps/s in the window after the recovery
    throughput_during: float | None = None  # steps/s while a degrading fault (straggler) was in force

    @property
    def degraded(self) -> bool:
        """Training slowed, never stopped: a degrading fault that no restart followed."""
        return self.fault.fault in DEGRADING_FAULTS and self.restart is None

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
        )


def faults_during_training(run: RunModel) -> list[Fault]:
    return [f for f in run.faults if f.t_invoke < run.t_training_ended]


@functools.lru_cache(maxsize=4)  # several checkers ask of one model
def recoveries(run: RunModel) -> tuple[Recovery, ...]:
    """How each fault during training was recovered from, in time order."""
    faults = faults_during_training(run)
    return tuple(
        _recovery(run, fault, faults[i + 1] if i + 1 < len(faults) else None) for i, fault in enumerate(faults)
    )


def _recovery(run: RunModel, fault: Fault, next_fault: Fault | None) -> Recovery:
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
        and run.beats_between(fault.t_ok, next_fault.t_invoke)
    ):
        restart = None  # training went on after this fault; the restart belongs to a later one
    first = run.first_step_after(max(restart.t, fault.t_ok) if restart else fault.t_ok)
    world_after = run.world_at(first) if first else None
    rate_after = throughput(run, first.t, first.t + THROUGHPUT_WINDOW_S) if first else None
    if restart is None:
        during = None
        if fault.fault in DEGRADING_FAULTS:
            healed = run.healed_at(fault)
            until = healed if healed is not None else min(run.t_training_ended, run.t_end)
            during = throughput(run, fault.t_ok, until)
            rate_after = throughput(run, healed, healed + THROUGHPUT_WINDOW_S) if healed is not None else None
        return Recovery(fault, None, first, None, None, world_before, world_after, rate_before, rate_after, during)
    recovering = run.cohort_at(first.t) if first else restart
    steps_before = run.highest_step_before(restart.t) if run.steps_known else None
    return Recovery(
        fault, restart, first, steps_before, recovering.resumed_from, world_before, world_after, rate_before, rate_after
    )


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
