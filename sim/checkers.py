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
from typing import Callable, Sequence

from .runmodel import REVERSIBLE_FAULTS, Cohort, Fault, RunModel, clock, node_order
from .verdict import CheckResult, FaultRecovery, Verdict

EXPECTED = ("recovers", "fails")
# Steps averaged on each side of a resume, so one noisy batch does not decide.
NOISE_WINDOW = 10  # steps whose wobble sets the bar for a loss jump
NOISE_FACTOR = 3.0
LOSS_WINDOW = 3
# Throughput before and after a fault is measured over this much training.
THROUGHPUT_WINDOW_S = 10.0
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
    instrumented: bool = True  # the node image's step hooks ran in the workers (`up --no-instrument` turns them off)

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
                      "target_steps": start.get("target_steps"), "ckpt_interval": start.get("ckpt_interval"),
                      "instrumented": cluster.get("instrument")}
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


# ---------------------------------------------------------------- fault recoveries (shared by several checkers)

@dataclasses.dataclass(frozen=True)
class _Recovery:
    fault: Fault
    restart: Cohort | None  # the cohort the fault led to; None: training went on without a restart
    first_progress: dict | None  # the first beat (a step, where steps are seen) after the restart or fault
    steps_before: int | None  # highest step reached before the restart (None: steps not numbered across restarts)
    resumed_from: int | None  # step the recovering cohort resumed from
    world_before: int | None
    world_after_restart: int | None
    throughput_before: float | None  # steps/s in the window before the fault
    throughput_after: float | None  # steps/s in the window after the recovery

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

    def public(self) -> FaultRecovery:
        t_recovered = self.first_progress["t"] if self.first_progress else None
        return FaultRecovery(op=self.fault.op, fault=self.fault.fault, target=self.fault.target,
                             t_fault=self.fault.t_ok, t_recovered=t_recovered,
                             recovery_s=None if t_recovered is None else round(t_recovered - self.fault.t_ok, 3),
                             steps_lost=self.steps_lost, world_before=self.world_before, world_after=self.world_after,
                             throughput_before=self.throughput_before, throughput_after=self.throughput_after)


def _faults_during_training(run: RunModel) -> list[Fault]:
    return [f for f in run.faults if f.t_invoke < run.t_training_ended]


def _recoveries(run: RunModel) -> list[_Recovery]:
    faults = _faults_during_training(run)
    return [_recovery(run, fault, faults[i + 1] if i + 1 < len(faults) else None)
            for i, fault in enumerate(faults)]


def _recovery(run: RunModel, fault: Fault, next_fault: Fault | None) -> _Recovery:
    before = run.last_beat_before(fault.t_invoke)
    # Before the workers' first beat (still importing), the world they were started at.
    cohort_then = run.cohort_at(fault.t_invoke)
    world_before = run.world_at(before) if before else cohort_then.world_size if cohort_then else None
    rate_before = _throughput(run, fault.t_invoke - THROUGHPUT_WINDOW_S, fault.t_invoke)
    # From the invoke: a slow fault (stop with a grace period, scale) may see the restart before its ok.
    restart = run.first_cohort_after(fault.t_invoke)
    if (restart and next_fault and restart.t > next_fault.t_invoke
            and run.beats_between(fault.t_ok, next_fault.t_invoke)):
        restart = None  # training went on after this fault; the restart belongs to a later one
    first = run.first_step_after(max(restart.t, fault.t_ok) if restart else fault.t_ok)
    world_after = run.world_at(first) if first else None
    rate_after = _throughput(run, first["t"], first["t"] + THROUGHPUT_WINDOW_S) if first else None
    if restart is None:
        return _Recovery(fault, None, first, None, None, world_before, world_after, rate_before, rate_after)
    recovering = run.cohort_at(first["t"]) if first else restart
    steps_before = run.highest_step_before(restart.t) if run.steps_known else None
    return _Recovery(fault, restart, first, steps_before, recovering.resumed_from, world_before, world_after,
                     rate_before, rate_after)


def _throughput(run: RunModel, begin: float, end: float) -> float | None:
    """Steps per second in [begin, end) on one rank (rank 0, or the script's own rank-less
    progress lines): the steps gained over the time they took, cohort by cohort. Step numbers,
    not record counts: the instrumentation writes a step record at most twice a second."""
    index = bisect.bisect_left(run.progress_times, begin)
    spans: dict[int, list[dict]] = {}
    for record in run.progress[index:bisect.bisect_left(run.progress_times, end)]:
        if record.get("rank") in (0, None):
            spans.setdefault(run.cohort_index(record["t"]), []).append(record)
    steps = sum(max(r["step"] for r in span) - min(r["step"] for r in span) for span in spans.values())
    seconds = sum(span[-1]["t"] - span[0]["t"] for span in spans.values())
    return round(steps / seconds, 3) if steps > 0 and seconds > 0 else None


# ---------------------------------------------------------------- checkers

def check_completed(history: Sequence[dict], spec: RunSpec) -> CheckResult:
    """The job reached its final step and every agent still in the job exited 0."""
    run = RunModel(history)
    reasons = []
    if run.finished(spec.target_steps) is None:
        reasons.append(_not_finished_reason(run, spec))
    removed = run.removed_on_purpose()
    for node in run.agent_nodes:
        if node in removed:
            continue
        last = run.lifecycle(node)
        if last is None or last.get("action") != "die":
            reasons.append(f"{node}: no agent exit recorded (still running at the run end?)")
        elif last.get("exit_code") != 0:
            reasons.append(f"{node}'s agent exited {_exit_text(last)} at {clock(last['t'])}")
    valid = not reasons
    excused = [node for node in run.agent_nodes if node in removed]
    reasons += [f"{node} excused: taken out by {removed[node].describe()}" for node in excused]
    return CheckResult("completed", valid, tuple(reasons), {"final_step": run.highest_step, "excused_nodes": excused})


def check_restart_budget(history: Sequence[dict], spec: RunSpec) -> CheckResult:
    """Restarts used per node stay within max_restarts."""
    run = RunModel(history)
    used: dict[str, int] = {}
    # An agent logs "k/m attempts left" just before restart number m-k+1.
    for record in run.agent:
        if record.get("event") == "group_failed" and record.get("attempts_left") is not None:
            budget = spec.max_restarts if record.get("max_restarts") is None else record["max_restarts"]
            _raise(used, record.get("node"), budget - record["attempts_left"] + 1)
    # The workers see the same count as TORCHELASTIC_RESTART_COUNT.
    for record in run.starts + run.beats:
        _raise(used, record.get("node"), record.get("restart") or 0)
    per_node = {node: used[node] for node in sorted(used, key=node_order)}
    reasons = [f"{node} used {count} restarts > max {spec.max_restarts}"
               for node, count in per_node.items() if count > spec.max_restarts]
    valid = not reasons
    if per_node:
        reasons.append(f"torch counts restarts per agent, not per job: {sum(per_node.values())} in all "
                       f"across {len(per_node)} nodes, each allowed {spec.max_restarts}")
    else:
        reasons.append(f"no restarts (each agent allowed {spec.max_restarts}; torch counts them per agent)")
    return CheckResult("restart_budget", valid, tuple(reasons), {"per_node": per_node})


def check_world_size(history: Sequence[dict], spec: RunSpec) -> CheckResult:
    """Every trainer's world size lies within [min_nodes, max_nodes] x nproc_per_node."""
    run = RunModel(history)
    bad: dict[int, dict] = {}  # world size -> first record that reported it
    for record in run.starts + run.beats:
        world = record.get("world_size")
        if world is None and record.get("source") == "log":
            continue  # a progress line matched in the log: its world size is unknown, not wrong
        if not (isinstance(world, int) and spec.min_world <= world <= spec.max_world):
            bad.setdefault(world, record)
    reasons = [f"rank {r.get('rank')} on {r.get('node')} reported world size {world} at {clock(r['t'])}, "
               f"outside [{spec.min_world}, {spec.max_world}] ({spec.min_nodes}..{spec.max_nodes} nodes "
               f"x {spec.nproc_per_node} workers)" for world, r in bad.items()]
    seen = sorted({r.get("world_size") for r in run.starts + run.beats if isinstance(r.get("world_size"), int)})
    return CheckResult("world_size", not reasons, tuple(reasons[:MAX_EXAMPLES]), {"world_sizes": seen})


def check_ranks(history: Sequence[dict], spec: RunSpec) -> CheckResult:
    """Each cohort's workers hold ranks 0..W-1, once each."""
    run = RunModel(history)
    reasons = [reason for cohort in run.cohorts for reason in _rank_problems(cohort)]
    return CheckResult("ranks", not reasons, tuple(reasons[:MAX_EXAMPLES]), {"cohorts": len(run.cohorts)})


def _rank_problems(cohort: Cohort) -> list[str]:
    world = cohort.world_size
    where = f"the cohort started at {clock(cohort.t)} (world {world})"
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
    run = RunModel(history)
    recoveries = _recoveries(run)
    lost = {r.fault.op: r.steps_lost for r in recoveries}
    metrics = {"steps_lost": lost, "final_step": run.highest_step, "step_source": run.step_source,
               "step_efficiency": _step_efficiency(run), "zombie_records": len(run.zombies)}
    if not run.steps_known:
        return CheckResult("progress", True, (_steps_not_measurable(run),), metrics, measured=False)
    # Only the trainer says which step each rank resumed from; other sources give the cohort's first step.
    reasons = _skipped_steps(run) + _resume_disagreements(run) if run.step_source == "trainer" else []
    for recovery in recoveries:
        reasons += _steps_lost_problems(recovery, spec)
    return CheckResult("progress", not reasons, tuple(reasons[:MAX_EXAMPLES]), metrics)


def _steps_not_measurable(run: RunModel) -> str:
    enable = ("pass --progress-regex with a (?P<step>...) group matching the script's own step lines "
              "(scenario: cluster.progress), or call elastic_sim_progress.report(step) in the script")
    if run.step_source == "none":
        return ("not measurable here: no training step was seen (no shipped-trainer lines, no progress regex, "
                f"and no torch.optim step from the instrumentation); to enable it, {enable}")
    return ("not measurable here: steps are counted per worker process (the optimizer's state holds no step "
            f"count, as SGD's does not), so a resume cannot be told from a fresh start; to enable it, {enable}")


def _step_efficiency(run: RunModel) -> float | None:
    """Steps kept / steps run (torchft's measure): the final step over every step taken, the ones
    redone after a resume included (each cohort ran from its first step to its last). None where
    steps are not numbered across restarts."""
    if not run.steps_known or not run.progress:
        return None
    spans: dict[int, list[int]] = {}
    for record in run.progress:
        spans.setdefault(run.cohort_index(record["t"]), []).append(record["step"])
    taken = sum(max(steps) - min(steps) + 1 for steps in spans.values())
    return round(run.highest_step / taken, 4) if taken and run.highest_step else None


def _skipped_steps(run: RunModel) -> list[str]:
    """Per rank, each step is the previous one + 1, and a start's first step is resumed_from + 1."""
    by_rank: dict[object, list[dict]] = {}
    for record in sorted(run.starts + run.progress, key=lambda r: r["t"]):  # zombies left out
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
    when = f"after the restart at {clock(restarted_at)}" if restarted_at is not None else f"at {clock(t)}"
    if step > expected:
        skipped = f"step {expected}" if step == expected + 1 else f"steps {expected}..{step - 1}"
        return f"rank {rank} skipped {skipped} {when}"
    return f"rank {rank} went back to step {step} when step {expected} was due, {when}"


def _resume_disagreements(run: RunModel) -> list[str]:
    problems = []
    for cohort in run.cohorts:
        by_step: dict[int, list] = {}
        for start in cohort.starts:
            by_step.setdefault(start.get("resumed_from") or 0, []).append(start.get("rank"))
        if len(by_step) > 1:
            detail = "; ".join(f"{_ranks(sorted(ranks, key=_rank_order))} from step {step}"
                               for step, ranks in sorted(by_step.items()))
            problems.append(f"the cohort started at {clock(cohort.t)} resumed from different steps: {detail}")
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
    run = RunModel(history)
    if not run.losses_known:
        why = ("no loss was seen" if run.steps_known else "steps are not numbered across restarts, and no loss was seen")
        return CheckResult("loss_continuity", True, (
            f"not measurable here: {why}; to enable it, pass --progress-regex with (?P<step>...) and "
            "(?P<loss>...) groups matching the script's log lines, e.g. 'step (?P<step>\\d+) loss (?P<loss>[\\d.]+)', "
            "or call elastic_sim_progress.report(step, loss=loss)",), {"relative_jumps": []}, measured=False)
    reasons, jumps = [], []
    for cohort in run.cohorts:
        if not cohort.resumed_from:
            continue  # a fresh start (or an unknown resume point): nothing to continue from
        after = _first_losses(run, cohort)
        # The steps after a resume replay steps that already ran before the fault: compare
        # the same steps where possible (immune to the loss's own ups and downs), else the
        # last steps at or before the resumed one.
        replayed = _losses_before(run, cohort)
        overlap = sorted(set(after) & set(replayed))
        # The first replayed step's loss comes from the restored weights before any update, so
        # it matches even when the optimizer state was lost: it takes a second replayed step.
        if len(overlap) >= 2:
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
                           f"{clock(cohort.t)}: {mean_before:.4g} over steps {_span(before)} before, "
                           f"{mean_after:.4g} over steps {_span(after)} after (tolerance {spec.loss_jump_tolerance:.0%})")
    return CheckResult("loss_continuity", not reasons, tuple(reasons[:MAX_EXAMPLES]), {"relative_jumps": jumps})


def _step_noise(losses: dict[int, float], up_to_step: int) -> float:
    """Mean absolute change between consecutive steps over the NOISE_WINDOW steps up to `up_to_step`."""
    steps = [s for s in sorted(losses) if s <= up_to_step][-NOISE_WINDOW:]
    diffs = [abs(losses[b] - losses[a]) for a, b in zip(steps, steps[1:]) if b == a + 1]
    return _mean(diffs) if diffs else 0.0


def _losses_before(run: RunModel, cohort: Cohort) -> dict[int, float]:
    """Every step's loss as last recorded before the cohort started."""
    latest: dict[int, float] = {}
    for record in run.progress[:bisect.bisect_left(run.progress_times, cohort.t)]:
        if record.get("loss") is not None:
            latest[record["step"]] = record["loss"]
    return latest


def _losses_up_to(run: RunModel, cohort: Cohort) -> dict[int, float]:
    """Loss of the last LOSS_WINDOW steps at or before the resumed step, as last recorded before the cohort."""
    latest: dict[int, float] = {}
    for record in run.progress[:bisect.bisect_left(run.progress_times, cohort.t)]:
        if record.get("step", 0) <= cohort.resumed_from and record.get("loss") is not None:
            latest[record["step"]] = record["loss"]
    return {step: latest[step] for step in sorted(latest)[-LOSS_WINDOW:]}


def _first_losses(run: RunModel, cohort: Cohort) -> dict[int, float]:
    """Loss of the cohort's first LOSS_WINDOW steps (the loss is all-reduced: any rank's will do)."""
    first: dict[int, float] = {}
    for record in run.cohort_progress(cohort):
        if record.get("loss") is not None:
            first.setdefault(record["step"], record["loss"])
    return {step: first[step] for step in sorted(first)[:LOSS_WINDOW]}


def check_hang(history: Sequence[dict], spec: RunSpec) -> CheckResult:
    """No stretch longer than hang_s without progress while no fault is in force."""
    run = RunModel(history)
    if not run.beats and not spec.instrumented:
        return CheckResult("hang", True, (
            "not measurable here: training cannot be seen (instrumentation off, no progress lines); to enable it, "
            "drop --no-instrument or pass --progress-regex",), {"longest_gap_s": None}, measured=False)
    active = _active_intervals(run, spec)
    stretches = list(zip(run.beat_times, run.beat_times[1:]))
    if run.finished(spec.target_steps) is None:  # the job stopped short: the tail counts too
        stretches.append((run.beat_times[-1] if run.beats else run.t_begin, run.t_end))
    reasons = []
    for begin, end in stretches:
        if end - begin <= spec.hang_s:
            continue
        for quiet_begin, quiet_end in _uncovered(begin, end, active):
            if quiet_end - quiet_begin > spec.hang_s:
                reasons.append(f"no progress for {quiet_end - quiet_begin:.1f} s ({clock(quiet_begin)} to "
                               f"{clock(quiet_end)}) with no fault in force (limit {spec.hang_s:g} s)")
    return CheckResult("hang", not reasons, tuple(reasons[:MAX_EXAMPLES]),
                       {"longest_gap_s": round(max((e - b for b, e in stretches), default=0.0), 3)})


def _active_intervals(run: RunModel, spec: RunSpec) -> list[tuple[float, float]]:
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
    run = RunModel(history)
    recoveries = _recoveries(run)
    if recoveries and not run.beats:
        # Nothing before the fault either: silence after it says nothing about recovery.
        why = ("instrumentation off, no progress lines" if not spec.instrumented else
               "no progress lines, and the instrumentation saw no optimizer step or collective call")
        return CheckResult("recovery", True, (
            f"not measurable here: no training was seen in the whole run ({why}), so no recovery can be timed; "
            "to enable it, keep the instrumentation on or pass --progress-regex",),
            {"recoveries": [dataclasses.asdict(r.public()) for r in recoveries]}, measured=False)
    problems, facts = [], []
    for recovery in recoveries:
        public = recovery.public()
        what = recovery.fault.describe()
        if public.recovery_s is None:
            problems.append(f"{what}: never recovered (no progress after it"
                            + (f"; workers restarted at {clock(recovery.restart.t)})" if recovery.restart else ")"))
        elif spec.max_recovery_s is not None and public.recovery_s > spec.max_recovery_s:
            problems.append(f"{what}: recovered in {public.recovery_s:.1f} s > max {spec.max_recovery_s:g} s")
        else:
            lost = "steps lost unknown" if public.steps_lost is None else f"{public.steps_lost} steps lost"
            facts.append(f"{what}: recovered in {public.recovery_s:.1f} s at world {public.world_after}, {lost}"
                         + _throughput_words(public))
    late = [f for f in run.faults if f.t_invoke >= run.t_training_ended]
    facts += [f"{f.describe()}: after training ended, not checked" for f in late]
    return CheckResult("recovery", not problems, tuple(problems + facts),
                       {"recoveries": [dataclasses.asdict(r.public()) for r in recoveries]})


def _throughput_words(recovery: FaultRecovery) -> str:
    if recovery.throughput_before is None and recovery.throughput_after is None:
        return ""
    def rate(value: float | None) -> str:
        return "?" if value is None else f"{value:.2f}"
    return f"; {rate(recovery.throughput_before)} -> {rate(recovery.throughput_after)} steps/s"


def check_fails_cleanly(history: Sequence[dict], spec: RunSpec) -> CheckResult:
    """For a run meant to fail: it did not complete, and every agent exited non-zero
    (or was killed) within fail_fast_s of the fault, none left hanging."""
    run = RunModel(history)
    reasons = []
    finished = run.finished(spec.target_steps)
    if finished is not None:
        reasons.append(f"the job completed (step {finished.get('final_step')} at {clock(finished['t'])}) "
                       "but was expected to fail")
    removed = run.removed_on_purpose()
    ended = {}  # node -> the fault its exit followed (op) and how long after
    for node in run.agent_nodes:
        last = run.lifecycle(node)
        if last is None or last.get("action") != "die":
            reasons.append(f"{node} still running at the run end: the job hung instead of failing")
            continue
        if last.get("exit_code") == 0 and node not in removed:
            reasons.append(f"{node}'s agent exited 0 at {clock(last['t'])}, as if the job had succeeded")
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


def _last_fault_before(run: RunModel, t: float) -> Fault | None:
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
                   rounds=_rounds(RunModel(history)))


def _rounds(run: RunModel) -> int:
    """Distinct rendezvous rounds the agents joined; cohorts when no agent said."""
    rounds = {r.get("round") for r in run.agent if r.get("event") == "rdzv_joined" and r.get("round") is not None}
    return len(rounds) if rounds else len(run.cohorts)


# ---------------------------------------------------------------- small helpers

def _rank_order(rank) -> tuple[int, object]:
    """Ranks in numeric order; anything not a number after them."""
    return (0, rank) if isinstance(rank, int) else (1, str(rank))


def _raise(counts: dict, key, value: int) -> None:
    if key is not None:
        counts[key] = max(counts.get(key, 0), value)


def _not_finished_reason(run: RunModel, spec: RunSpec) -> str:
    goal = f"step {spec.target_steps}" if spec.target_steps is not None else "its end"
    if run.step_source == "trainer":
        last = run.progress[-1]
        return (f"the job never reached {goal}: highest step {run.highest_step}, "
                f"last progress at {clock(last['t'])}, no trainer summary")
    ended = "no agent reported its worker group finished"
    if not run.beats:
        return f"the job never reached {goal}: {ended}, and no training was seen"
    step = f", highest step {run.highest_step}" if run.steps_known and run.progress else ""
    return f"the job never reached {goal}: {ended}; last training seen at {clock(run.beats[-1]['t'])}{step}"


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
