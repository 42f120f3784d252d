"""Checkers: pure functions of a run, as in Jepsen's checker.clj.

Each checker takes the run model (sim/verdict/runmodel.py: the history read once) and a RunSpec, and
returns a CheckResult. Nothing here reads files, clocks or Docker, so every rule is unit-tested
on hand-written histories. Terms: a *fault* is a fault operation whose `ok` record exists, other
than the heal operations (heal, unpause) that undo earlier faults; a *cohort* is the set of
worker processes started together for one rendezvous round; what followed each fault (its
restart and recovery) and each resume (the loss) is computed in sim/verdict/recovery.py.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
import posixpath
import re
from collections.abc import Callable, Sequence

from sim.core.errors import HistoryError, UsageError
from sim.core.history import DockerRecord, TrainerRecord, WorkerRecord
from sim.verdict import (
    AgentEnd,
    CheckpointFilesMetrics,
    CheckpointIntegrityMetrics,
    CheckResult,
    CompletedMetrics,
    FailsCleanlyMetrics,
    FaultRecovery,
    HangMetrics,
    LossContinuityMetrics,
    Metrics,
    ProgressMetrics,
    RanksMetrics,
    RecoveryMetrics,
    RestartBudgetMetrics,
    SingleGroupMetrics,
    StaleCheckpointMetrics,
    StalledMetrics,
    TrainedMetrics,
    Verdict,
    WorldSizeMetrics,
)
from sim.verdict.recovery import LOSS_JUMP_TOLERANCE, Recovery, loss_across_resumes, recoveries
from sim.verdict.runmodel import STEP_SOURCE_WORDS, Beat, Cohort, FaultEvent, RunModel, clock

EXPECTED = ("recovers", "fails", "hangs")
# The shipped trainer's checkpoint files (trainer/train.py's checkpoint_path) and their temp files.
CHECKPOINT_FILE = re.compile(r"^ckpt-(\d+)\.pt(\.tmp\.\d+)?$")
# At most this many violations listed in one result's reasons.
MAX_EXAMPLES = 5
# A worker of a superseded round is blocked in its next collective: one that still advances this many
# steps after a newer round started trains in a group of its own (split brain).
SPLIT_BRAIN_STEPS = 10


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
    loss_jump_tolerance: float = LOSS_JUMP_TOLERANCE
    fail_fast_s: float = 60.0
    instrumented: bool = True  # the node image's step hooks ran in the workers (`up --no-instrument` turns them off)

    def __post_init__(self) -> None:
        for name in ("min_nodes", "max_nodes", "nproc_per_node"):
            _require_int(name, getattr(self, name), at_least=1)
        _require_int("max_restarts", self.max_restarts, at_least=0)
        if self.max_nodes < self.min_nodes:
            raise UsageError(f"max_nodes {self.max_nodes} < min_nodes {self.min_nodes}: give max_nodes >= min_nodes")
        for name in ("target_steps", "ckpt_interval"):
            if getattr(self, name) is not None:
                _require_int(name, getattr(self, name), at_least=1)
        if self.max_steps_lost is not None:
            _require_int("max_steps_lost", self.max_steps_lost, at_least=0)
        if self.expected not in EXPECTED:
            raise UsageError(f"expected {self.expected!r}: must be one of {', '.join(EXPECTED)}")
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
    def from_run(cls, run: RunModel, **overrides) -> RunSpec:
        """The spec recorded in the run "start" record; keyword arguments win over it."""
        start = run.start
        values = {}
        if start is not None:
            cluster = start.spec_fields
            min_nodes = 1 if cluster.min_nodes is None else cluster.min_nodes
            max_nodes = cluster.max_nodes
            if max_nodes is None:  # ClusterSpec's rule: max_nodes defaults to nodes
                max_nodes = max(min_nodes if cluster.nodes is None else cluster.nodes, min_nodes)
            values = {
                "min_nodes": min_nodes,
                "max_nodes": max_nodes,
                "nproc_per_node": cluster.nproc_per_node,
                "max_restarts": cluster.max_restarts,
                "target_steps": start.target_steps,
                "ckpt_interval": start.ckpt_interval,
                "instrumented": cluster.instrument,
            }
            values = {k: v for k, v in values.items() if v is not None}
        values.update(overrides)
        missing = [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING and f.name not in values]
        if missing:
            raise HistoryError(
                f"history: no run start record gives {', '.join(missing)}; "
                "pass them (e.g. `sim report --expect`, RunSpec keyword arguments)"
            )
        return cls(**values)


def _require_int(name: str, value: object, at_least: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < at_least:
        raise UsageError(f"{name} {value!r}: must be a whole number >= {at_least}")


def _require_positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise UsageError(f"{name} {value!r}: must be a finite number > 0")


# ---------------------------------------------------------------- checkers


def check_trained(run: RunModel, spec: RunSpec) -> CheckResult:
    """Training was seen: an optimizer step, or a collective call after the process group's set-up (the
    instrumentation's), or a step line (a progress regex's, the shipped trainer's). A run that never trained
    passes nothing, whatever else it did: it FAILs, or, where nothing could have seen training, it cannot tell."""
    metrics = TrainedMetrics(training_seen=run.trained, first_training_t=run.beats[0].t if run.beats else None)
    if run.trained:
        first = (run.beats or run.zombies)[0]
        return CheckResult(
            "trained", True, (f"training seen from {clock(first.t)} ({_training_source(run)})",), metrics
        )
    if not (spec.instrumented or run.step_lines_expected):
        return CheckResult(
            "trained",
            False,
            (
                "cannot tell whether the job trained: nothing could see it (--no-instrument, and no progress regex); "
                "drop --no-instrument, or pass --progress-regex with a (?P<step>...) group matching the script's "
                "step lines",
            ),
            metrics,
            measured=False,
        )
    return CheckResult("trained", False, (no_training_reason(run),), metrics)


NO_TRAINING_SEEN = "no optimizer step and no collective call after the process group's set-up in any worker"


def no_training_reason(run: RunModel) -> str:
    """Why the run shows no training, in words: whether the job ended, and how its workers exited."""
    exits = run.worker_exits()
    if not run.starts and not run.agent_events("group_started"):
        return f"no training seen: no worker ever started (by {clock(run.t_end)})"
    ended = job_ended(run)
    if not ended:
        last = f"{clock(run.t_end)} (the history's last record)"
        return f"no training seen: {NO_TRAINING_SEEN}, by {last}, the job still running"
    how = exits_words(exits)
    if how is None and run.agent_events("group_finished"):
        how = "every agent's workers finished (exit 0)"
    return f"the job ended without training: {NO_TRAINING_SEEN}" + (f"; {how}" if how else "")


def job_ended(run: RunModel) -> bool:
    """Every node's container has exited, or an agent's workers finished (the job's end from torch's side)."""
    return bool(run.agent_events("group_finished")) or (
        bool(run.agent_nodes)
        and all((last := run.lifecycle(node)) is not None and last.action == "die" for node in run.agent_nodes)
    )


def exits_words(exits: dict[tuple, int | None]) -> str | None:
    """ "every rank exited 0", or "rank 0 exited 1, rank 1 exited 0" (each rank's last exit); None: none seen."""
    if not exits:
        return None
    last: dict[object, int | None] = {}
    for (_, rank, _), code in exits.items():
        last[rank] = code
    codes = set(last.values())
    if len(codes) == 1:
        code = next(iter(codes))
        return f"every rank exited {'with an unknown code' if code is None else code}"
    return ", ".join(
        f"rank {rank} exited {code}" for rank, code in sorted(last.items(), key=lambda i: _rank_order(i[0]))
    )


def _training_source(run: RunModel) -> str:
    if run.step_source != "none":
        return STEP_SOURCE_WORDS[run.step_source]
    return "collective calls (the instrumentation)"


def check_completed(run: RunModel, spec: RunSpec) -> CheckResult:
    """The job reached its final step and every agent still in the job exited 0."""
    reasons = []
    if run.finished(spec.target_steps) is None:
        reasons.append(_not_finished_reason(run, spec))
    removed = run.removed_on_purpose()
    # torch's own end for a node that came to join as the job finished (RendezvousClosedError, exit 1): the
    # training completed without it, so its exit is not the job's (the late-join-at-end diagnosis says so).
    refused = run.refused_at_end() if run.finished(spec.target_steps) is not None else {}
    for node in run.agent_nodes:
        if node in removed:
            continue
        last = run.lifecycle(node)
        if last is None or last.action != "die":
            reasons.append(f"{node}: no agent exit recorded (still running at the run end?)")
        elif last.exit_code != 0 and not (node in refused and last.exit_code == 1 and last.t >= refused[node].t):
            reasons.append(f"{node}'s agent exited {_exit_text(last)} at {clock(last.t)}")
    valid = not reasons
    excused = [node for node in run.agent_nodes if node in removed or node in refused]
    reasons += [
        f"{node} excused: taken out by {removed[node].describe()}"
        if node in removed
        else f"{node} excused: it came to join at {clock(refused[node].t)}, after the others finished; torch's "
        "join of a closed rendezvous ends its agent with RendezvousClosedError, exit 1 (late-join-at-end)"
        for node in excused
    ]
    metrics = CompletedMetrics(final_step=run.highest_step, excused_nodes=tuple(excused))
    return CheckResult("completed", valid, tuple(reasons), metrics)


def check_restart_budget(run: RunModel, spec: RunSpec) -> CheckResult:
    """Restarts used per node stay within max_restarts."""
    per_node = run.restarts_per_node(spec.max_restarts)
    reasons = [
        f"{node} used {count} restarts > max {spec.max_restarts}"
        for node, count in per_node.items()
        if count > spec.max_restarts
    ]
    valid = not reasons
    if per_node:
        reasons.append(
            f"torch counts restarts per agent, not per job: {sum(per_node.values())} in all "
            f"across {len(per_node)} nodes, each allowed {spec.max_restarts}"
        )
    else:
        reasons.append(f"no restarts (each agent allowed {spec.max_restarts}; torch counts them per agent)")
    return CheckResult("restart_budget", valid, tuple(reasons), RestartBudgetMetrics(per_node=dict(per_node)))


def check_world_size(run: RunModel, spec: RunSpec) -> CheckResult:
    """Every trainer's world size lies within [min_nodes, max_nodes] x nproc_per_node."""
    bad: dict[int, dict] = {}  # world size -> first record that reported it
    for record in run.starts + run.beats:
        world = record.world_size
        if world is None and isinstance(record, WorkerRecord) and record.source == "log":
            continue  # a progress line matched in the log: its world size is unknown, not wrong
        if not (isinstance(world, int) and spec.min_world <= world <= spec.max_world):
            bad.setdefault(world, record)
    reasons = [
        f"rank {r.rank} on {r.node} reported world size {world} at {clock(r.t)}, "
        f"outside [{spec.min_world}, {spec.max_world}] ({spec.min_nodes}..{spec.max_nodes} nodes "
        f"x {spec.nproc_per_node} workers)"
        for world, r in bad.items()
    ]
    seen = sorted({r.world_size for r in run.starts + run.beats if r.world_size is not None})
    return CheckResult(
        "world_size", not reasons, tuple(reasons[:MAX_EXAMPLES]), WorldSizeMetrics(world_sizes=tuple(seen))
    )


def check_ranks(run: RunModel, spec: RunSpec) -> CheckResult:
    """Each cohort's workers hold ranks 0..W-1, once each."""
    reasons = [reason for cohort in run.cohorts for reason in _rank_problems(cohort)]
    return CheckResult("ranks", not reasons, tuple(reasons[:MAX_EXAMPLES]), RanksMetrics(cohorts=len(run.cohorts)))


def _rank_problems(cohort: Cohort) -> list[str]:
    world = cohort.world_size
    where = f"the cohort started at {clock(cohort.t)} (world {world})"
    ranks = [s.rank for s in cohort.starts]
    problems = [
        f"{where}: rank {rank} started {ranks.count(rank)} times"
        for rank in sorted(set(ranks), key=_rank_order)
        if ranks.count(rank) > 1
    ]
    if not isinstance(world, int):
        return problems + [f"{where}: no world size recorded"]
    outside = sorted({r for r in ranks if not (isinstance(r, int) and 0 <= r < world)}, key=_rank_order)
    if outside:
        problems.append(f"{where}: {_ranks(outside)} outside 0..{world - 1}")
    missing = sorted(set(range(world)) - set(ranks))
    if missing:
        problems.append(f"{where}: {_ranks(missing)} never started")
    return problems


def check_progress(run: RunModel, spec: RunSpec) -> CheckResult:
    """Training resumes from the last checkpoint after each fault and never skips a step."""
    lost = {r.fault.op: r.steps_lost for r in recoveries(run)}
    metrics = ProgressMetrics(
        steps_lost=lost,
        final_step=run.highest_step,
        step_source=run.step_source,
        step_efficiency=_step_efficiency(run),
        zombie_records=len(run.zombies),
    )
    if not run.steps_known:
        return CheckResult("progress", True, (_steps_not_measurable(run),), metrics, measured=False)
    # Only the trainer says which step each rank resumed from; other sources give the cohort's first step.
    reasons = _skipped_steps(run) + _resume_disagreements(run) if run.step_source == "trainer" else []
    for recovery in recoveries(run):
        reasons += _steps_lost_problems(recovery, spec, run)
    return CheckResult("progress", not reasons, tuple(reasons[:MAX_EXAMPLES]), metrics)


def _steps_not_measurable(run: RunModel) -> str:
    enable = (
        "pass --progress-regex with a (?P<step>...) group matching the script's own step lines "
        "(scenario: cluster.progress), or call elastic_sim_progress.report(step) in the script"
    )
    if run.step_source == "none":
        return (
            "not measurable here: no training step was seen (no shipped-trainer lines, no progress regex, "
            f"and no torch.optim step from the instrumentation); to enable it, {enable}"
        )
    return (
        "not measurable here: steps are counted per worker process (the optimizer's state holds no step "
        f"count, as SGD's does not), so a resume cannot be told from a fresh start; to enable it, {enable}"
    )


def _step_efficiency(run: RunModel) -> float | None:
    """Steps kept / steps run (torchft's measure): the final step over every step taken, the ones
    redone after a resume included (each cohort ran from its first step to its last). None where
    steps are not numbered across restarts."""
    if not run.steps_known or not run.progress:
        return None
    spans: dict[int, list[int]] = {}
    for record in run.progress:
        spans.setdefault(run.cohort_index(record.t), []).append(record.step)
    taken = sum(max(steps) - min(steps) + 1 for steps in spans.values())
    return round(run.highest_step / taken, 4) if taken and run.highest_step else None


def _skipped_steps(run: RunModel) -> list[str]:
    """Per rank, each step is the previous one + 1, and a start's first step is resumed_from + 1."""
    by_rank: dict[object, list] = {}
    for record in sorted(run.starts + run.progress, key=lambda r: r.t):  # zombies left out
        by_rank.setdefault(record.rank, []).append(record)
    problems = []
    for rank in sorted(by_rank, key=_rank_order):
        expected, restarted_at = None, None
        for record in by_rank[rank]:
            if record.kind == "start":
                expected, restarted_at = (record.resumed_from or 0) + 1, record.t
            elif record.kind == "progress":
                step = record.step
                if expected is not None and step != expected:
                    problems.append(_step_problem(rank, expected, step, record.t, restarted_at))
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
            by_step.setdefault(start.resumed_from or 0, []).append(start.rank)
        if len(by_step) > 1:
            detail = "; ".join(
                f"{_ranks(sorted(ranks, key=_rank_order))} from step {step}" for step, ranks in sorted(by_step.items())
            )
            problems.append(f"the cohort started at {clock(cohort.t)} resumed from different steps: {detail}")
    return problems


def _steps_lost_problems(recovery: Recovery, spec: RunSpec, run: RunModel) -> list[str]:
    lost = recovery.steps_lost
    if lost is None or recovery.restart is None:
        return []
    # A checkpoint damaged on purpose (corrupted, or its write killed) is skipped for the one before
    # it: each such fault in the round that ended costs one more interval, by design.
    round_began = run.cohort_at(recovery.fault.t_invoke)
    damaged = sum(
        1
        for f in run.faults
        if f.kind.damages_checkpoint
        and (round_began is None or f.t_ok >= round_began.t)
        and f.t_ok <= recovery.restart.t
    )
    interval = None if spec.ckpt_interval is None else spec.ckpt_interval * (1 + damaged)
    what = (
        f"after {recovery.fault.describe()}: {lost} steps lost "
        f"(reached {recovery.steps_before or 0}, resumed from {recovery.resumed_from})"
    )
    problems = []
    if interval is not None and lost > interval:
        allowed = f"checkpoint interval {spec.ckpt_interval}" + (
            f" x {1 + damaged} (checkpoints damaged on purpose)" if damaged else ""
        )
        problems.append(f"{what} > {allowed}")
    if spec.max_steps_lost is not None and lost > spec.max_steps_lost:
        problems.append(f"{what} > max {spec.max_steps_lost}")
    return problems


def check_loss_continuity(run: RunModel, spec: RunSpec) -> CheckResult:
    """After each resume the loss carries on from where the checkpoint left it."""
    if not run.losses_known:
        why = "no loss was seen" if run.steps_known else "steps are not numbered across restarts, and no loss was seen"
        return CheckResult(
            "loss_continuity",
            True,
            (
                f"not measurable here: {why}; to enable it, pass --progress-regex with (?P<step>...) and "
                "(?P<loss>...) groups matching the script's log lines, "
                "e.g. 'step (?P<step>\\d+) loss (?P<loss>[\\d.]+)', "
                "or call elastic_sim_progress.report(step, loss=loss)",
            ),
            LossContinuityMetrics(relative_jumps=()),
            measured=False,
        )
    reasons, jumps = [], []
    for found in loss_across_resumes(run, spec.loss_jump_tolerance):
        jumps.append(round(found.relative, 4))
        if found.jumped:
            reasons.append(
                f"loss jumped {found.relative:+.0%} after the resume from step "
                f"{found.resume.resumed_from} at {clock(found.resume.t)}: "
                f"{found.mean_before:.4g} over steps {_span(found.before)} before, "
                f"{found.mean_after:.4g} over steps {_span(found.after)} after "
                f"(tolerance {spec.loss_jump_tolerance:.0%})"
            )
    return CheckResult(
        "loss_continuity", not reasons, tuple(reasons[:MAX_EXAMPLES]), LossContinuityMetrics(tuple(jumps))
    )


def check_checkpoint_integrity(run: RunModel, spec: RunSpec) -> CheckResult:
    """No start resumed from a checkpoint damaged on purpose (corrupted, or its write killed)
    unless that step's checkpoint was written again after the damage."""
    starts = [r for r in run.starts if isinstance(r, TrainerRecord) and r.resumed_from is not None]
    if not starts:
        loads = [r for r in run.records if isinstance(r, WorkerRecord) and r.event == "load" and r.path]
        if loads:
            return _checkpoint_integrity_by_path(run, loads)
        return CheckResult(
            "checkpoint_integrity",
            True,
            (
                "not measurable here: no start said which checkpoint it resumed from (no checkpoint load from a "
                "file was seen); to enable it, keep the instrumentation on (no --no-instrument) and load the "
                "checkpoint with torch.load(path) or torch.distributed.checkpoint, from the shared /ckpt "
                "($SIM_CKPT_DIR) where the checkpoint faults act",
            ),
            CheckpointIntegrityMetrics(damaged_steps=()),
            measured=False,
        )
    written = [r for r in run.records if isinstance(r, TrainerRecord) and r.kind == "checkpoint"]
    violations, notes, damaged = [], [], []
    for fault in run.faults:
        if not fault.kind.damages_checkpoint:
            continue
        file = fault.result.file or ""
        match = CHECKPOINT_FILE.match(posixpath.basename(file))
        if match is None:
            notes.append(
                f"{fault.describe()} damaged {file or 'a file it did not name'}: no checkpoint step in its name"
            )
            continue
        step = int(match.group(1))
        if fault.kind.strikes_in_write and match.group(2) and fault.result.gone_at_kill:
            # The temp file was gone right after the kill: the worker had renamed it into place, whole,
            # between the trigger seeing it open and the signal (seen under load); nothing was damaged.
            notes.append(f"{fault.describe()} landed just after the write of step {step} completed ({file} renamed)")
            continue
        damaged.append(step)
        # Starts after the damage was done (its ok record): one that resumed from `step` loaded the
        # damaged file, unless a checkpoint of `step` was written again in between.
        for start in (s for s in starts if s.t > fault.t_ok and s.resumed_from == step):
            if not any(fault.t_ok < w.t < start.t and w.step == step for w in written):
                violations.append(
                    f"rank {start.rank} on {start.node} resumed from step {step} at {clock(start.t)}, "
                    f"after {fault.describe()} damaged {file}, with no checkpoint of step {step} written since"
                )
    listed = _steps(sorted(set(damaged))) if damaged else ""
    return _integrity(violations, notes, "no start resumed from", listed, CheckpointIntegrityMetrics(tuple(damaged)))


def _checkpoint_integrity_by_path(run: RunModel, loads: list[WorkerRecord]) -> CheckResult:
    """Any script's checkpoint_integrity, from the instrumentation's records: no process loaded a file damaged
    on purpose (or a torch.distributed.checkpoint folder holding it) unless it was saved again since."""
    saves = [r for r in run.records if isinstance(r, WorkerRecord) and r.event == "save" and r.path]
    violations, notes, damaged = [], [], []
    for fault in run.faults:
        if not fault.kind.damages_checkpoint:
            continue
        file = fault.result.file or ""
        if not file:
            notes.append(f"{fault.describe()} damaged a file it did not name")
            continue
        damaged.append(file)
        for load in (r for r in loads if r.t > fault.t_ok and _holds(r.path, file)):
            if not any(fault.t_ok < w.t < load.t and _holds(w.path, file) for w in saves):
                violations.append(
                    f"rank {load.rank} on {load.node} loaded {load.path} at {clock(load.t)}, after "
                    f"{fault.describe()} damaged {file}, with no save of it since"
                )
    listed = ", ".join(sorted(set(damaged)))
    return _integrity(violations, notes, "no process loaded", listed, CheckpointFilesMetrics(tuple(damaged)))


def _integrity(violations: list[str], notes: list[str], none: str, damaged: str, metrics: Metrics) -> CheckResult:
    """checkpoint_integrity's result: the violations, else that none loaded what was `damaged` (listed)."""
    if not violations:
        notes.append(f"{none} a damaged checkpoint ({damaged})" if damaged else "no checkpoint was damaged on purpose")
    return CheckResult("checkpoint_integrity", not violations, tuple(violations[:MAX_EXAMPLES] + notes), metrics)


def _holds(path: str | None, file: str) -> bool:
    """Whether loading or saving `path` touches `file`: the file itself, or a checkpoint folder holding it."""
    if not path:
        return False
    path, file = posixpath.normpath(path), posixpath.normpath(file)
    return path == file or file.startswith(path.rstrip("/") + "/")


@dataclasses.dataclass(frozen=True)
class StaleWrite:
    """A checkpoint written by a worker of a superseded round: it finished after a newer round of the
    job had started without the writer (a frozen node woken up), and what became of it."""

    write: Beat  # the trainer's "checkpoint" line, or the instrumentation's "save" record
    newer: Cohort  # the round running when it finished
    replaced: Beat | None  # the newer round's write of the same file it replaced, if any
    loaded_by: Beat | None  # a later start that resumed from it, if any
    rewritten_at: float | None = None  # when a newer round wrote the same file again, if it did

    @property
    def step(self) -> int | None:
        return _written_step(self.write)

    @property
    def lost(self) -> bool:
        """Newer state is gone: a later resume went back to the superseded round's state, or the file held a
        newer round's checkpoint of another (or an unknown) step and no newer round wrote it again."""
        if self.loaded_by is not None:
            return True
        replaced_other = self.replaced is not None and (self.step is None or _written_step(self.replaced) != self.step)
        return replaced_other and self.rewritten_at is None

    def describe(self) -> str:
        w, newer = self.write, self.newer
        words = (
            f"{w.node} rank {w.rank} of a superseded round (world {w.world_size}, restart {w.restart}) wrote "
            f"{w.path}{_at_step(self.step)} at {clock(w.t)}, after the round of world {newer.world_size} "
            f"on {', '.join(sorted(newer.nodes))} had started at {clock(newer.t)}"
        )
        replaced = self.replaced
        if replaced is not None:
            was = _written_step(replaced)
            words += (
                f"; it replaced the newer round's {replaced.path}{_at_step(was)}, written at {clock(replaced.t)} by "
                f"{replaced.node} rank {replaced.rank}"
            )
            if self.rewritten_at is not None and self.loaded_by is None:
                words += f"; the newer round wrote it again at {clock(self.rewritten_at)}"
            elif was is not None and self.step is not None and was != self.step:
                words += f": {abs(was - self.step)} steps of newer state silently lost"
            elif was is None or self.step is None:
                words += ": newer state silently lost"
        loaded = self.loaded_by
        if loaded is not None:
            words += (
                f"; the resume at {clock(loaded.t)} ({loaded.node} rank {loaded.rank}) loaded it: "
                "the job went back to the superseded round's state"
            )
        if not self.lost:
            if replaced is None:
                words += "; nothing lost (no newer checkpoint had that name, and no later resume loaded it)"
            elif self.rewritten_at is not None:
                words += "; nothing lost (overwritten before any resume loaded it)"
            else:
                words += "; nothing lost (the newer round's checkpoint of that name held the same step)"
        return words


def _written_step(write: Beat) -> int | None:
    """The step a checkpoint write holds: the trainer's line says; a save, the optimizer's step then, else the
    step in a file name the shipped trainer gives (ckpt-00000020.pt)."""
    if write.step is not None:
        return write.step
    match = CHECKPOINT_FILE.match(posixpath.basename(write.path or ""))
    return int(match.group(1)) if match else None


def _at_step(step: int | None) -> str:
    return "" if step is None else f" (step {step})"


def stale_writes(run: RunModel) -> list[StaleWrite]:
    """Every checkpoint a worker of a superseded round wrote, with the newer write it replaced (the same
    file, written by a newer round since it started) and a later start that loaded it (a trainer start that
    resumed from its step, or a load of its file, with no newer write of that file in between)."""
    writes = run.checkpoint_writes
    found = []
    for write in (w for w in writes if run.is_zombie(w)):
        newer = run.cohort_at(write.t)
        same_file = [w for w in writes if w.path == write.path and not run.is_zombie(w)]
        replaced = [w for w in same_file if newer.t <= w.t < write.t]
        rewritten = next((w.t for w in same_file if w.t > write.t), None)
        loaded = _loaded(run, write, math.inf if rewritten is None else rewritten)
        found.append(StaleWrite(write, newer, replaced[-1] if replaced else None, loaded, rewritten))
    return found


def _loaded(run: RunModel, write: Beat, rewritten: float) -> Beat | None:
    """A start after `write` (and before its file was written again) that loaded it."""
    step = _written_step(write)
    for record in run.starts + [r for r in run.records if isinstance(r, WorkerRecord) and r.event == "load"]:
        if not write.t < record.t < rewritten or run.is_zombie(record):
            continue
        if isinstance(record, TrainerRecord):
            if step is not None and record.resumed_from == step and isinstance(write, TrainerRecord):
                return record
        elif record.event == "load" and record.path == write.path:
            return record
    return None


def check_single_group(run: RunModel, spec: RunSpec) -> CheckResult:
    """One group trains at a time: no worker of a superseded round keeps advancing its steps after a
    newer round started (split brain: e.g. the agents disagreed on who is alive, as under clock skew,
    and a node regrouped alone while the others trained on)."""
    groups: dict[tuple, list[Beat]] = {}
    for beat in run.zombies:
        index = bisect.bisect_right(run.cohort_times, beat.t)
        if beat.step is not None and index > 0:
            groups.setdefault((beat.node, beat.world_size, index - 1), []).append(beat)
    problems = []
    for (node, world, index), beats in groups.items():
        steps = [b.step for b in beats]
        if max(steps) - min(steps) < SPLIT_BRAIN_STEPS:
            continue
        newer = run.cohorts[index]
        others = sorted(
            {(b.node, run.world_at(b)) for b in run.progress if beats[0].t <= b.t <= beats[-1].t},
            key=lambda nw: str(nw[0]),
        )
        alongside = ", ".join(f"{n} (world {w})" for n, w in others) or "nothing else"
        problems.append(
            f"{node} (world {world}) trained on from step {min(steps)} to {max(steps)} until {clock(beats[-1].t)}, "
            f"after a newer round started at {clock(newer.t)}, while {alongside} trained too: two groups at once"
        )
    return CheckResult(
        "single_group", not problems, tuple(problems[:MAX_EXAMPLES]), SingleGroupMetrics(split_groups=len(problems))
    )


def check_stale_checkpoint(run: RunModel, spec: RunSpec) -> CheckResult:
    """No checkpoint written by a superseded round replaced newer state or was resumed from."""
    if not run.checkpoint_writes:
        return CheckResult(
            "stale_checkpoint",
            True,
            (
                "not measurable here: no checkpoint write was seen (no shipped-trainer checkpoint line, and no "
                "torch.save or torch.distributed.checkpoint save to a file from the instrumentation); to enable it, "
                "keep the instrumentation on and save checkpoints with torch.save or torch.distributed.checkpoint",
            ),
            StaleCheckpointMetrics(stale_writes=0, lost=0),
            measured=False,
        )
    found = stale_writes(run)
    lost = [s for s in found if s.lost]
    reasons = [s.describe() for s in lost][:MAX_EXAMPLES] + [s.describe() for s in found if not s.lost][:MAX_EXAMPLES]
    if not found:
        reasons.append(f"no checkpoint written by a superseded round ({len(run.checkpoint_writes)} writes seen)")
    for fault in (f for f in run.faults if f.kind.holds_write_open):
        # The frozen writer's own write lands, if at all, before its node starts a new worker.
        restarted = min((s.t for s in run.starts if s.node == fault.node and s.t > fault.t_ok), default=math.inf)
        if not any(w.node == fault.node and fault.t_ok < w.t < restarted for w in run.checkpoint_writes):
            reasons.append(
                f"{fault.describe()} held {fault.result.file} open: that write never completed "
                "(a superseded round's write that did not land)"
            )
    return CheckResult("stale_checkpoint", not lost, tuple(reasons), StaleCheckpointMetrics(len(found), len(lost)))


def check_hang(run: RunModel, spec: RunSpec) -> CheckResult:
    """No stretch longer than hang_s without progress while no fault is in force."""
    if not run.beats and not spec.instrumented:
        return CheckResult(
            "hang",
            True,
            (
                "not measurable here: training cannot be seen (instrumentation off, no progress lines); to enable it, "
                "drop --no-instrument or pass --progress-regex",
            ),
            HangMetrics(longest_gap_s=None),
            measured=False,
        )
    active = _active_intervals(run, spec)
    stretches = list(itertools.pairwise(run.beat_times))
    if run.finished(spec.target_steps) is None:  # the job stopped short: the tail counts too
        stretches.append((run.beat_times[-1] if run.beats else run.t_begin, run.t_end))
    reasons = []
    for begin, end in stretches:
        if end - begin <= spec.hang_s:
            continue
        for quiet_begin, quiet_end in _uncovered(begin, end, active):
            if quiet_end - quiet_begin > spec.hang_s:
                reasons.append(
                    f"no progress for {quiet_end - quiet_begin:.1f} s ({clock(quiet_begin)} to "
                    f"{clock(quiet_end)}) with no fault in force (limit {spec.hang_s:g} s)"
                )
    return CheckResult(
        "hang",
        not reasons,
        tuple(reasons[:MAX_EXAMPLES]),
        HangMetrics(longest_gap_s=round(max((e - b for b, e in stretches), default=0.0), 3)),
    )


def _active_intervals(run: RunModel, spec: RunSpec) -> list[tuple[float, float]]:
    """When each fault was in force: a reversible one until its heal (or the end);
    any other until it recovered, or for hang_s after it if it never did."""
    recovered = {r.fault.op: r.t_recovered for r in recoveries(run) if r.first_progress}
    intervals = []
    for fault in run.faults:
        if fault.kind.reversible:
            healed = run.healed_at(fault)
            intervals.append((fault.t_invoke, run.t_end if healed is None else healed))
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


def check_recovery(run: RunModel, spec: RunSpec) -> CheckResult:
    """Every fault was followed by training again, within max_recovery_s if given."""
    found = recoveries(run)
    if found and not run.beats:
        # Nothing before the fault either: silence after it says nothing about recovery.
        why = (
            "instrumentation off, no progress lines"
            if not spec.instrumented
            else "no progress lines, and the instrumentation saw no optimizer step or collective call"
        )
        return CheckResult(
            "recovery",
            True,
            (
                f"not measurable here: no training was seen in the whole run ({why}), so no recovery can be timed; "
                "to enable it, keep the instrumentation on or pass --progress-regex",
            ),
            RecoveryMetrics(recoveries=tuple(r.public() for r in found)),
            measured=False,
        )
    problems, facts = [], []
    for recovery in found:
        public = recovery.public()
        what = recovery.fault.describe()
        if public.struck_during:  # a compound fault: it landed while another was still being recovered from
            what += f" (struck during {public.struck_during}'s regroup)"
        if public.degraded:
            went = "training slowed" if recovery.fault.kind.slows_steps else "training went on"
            facts.append(f"{what}: {went}, no restart" + _throughput_words(public))
        elif public.recovery_s is None:
            cut = f"; {public.regroup_cut_by} struck during its regroup" if public.regroup_cut_by else ""
            flight = (
                f"{recovery.in_flight} step{'s' if recovery.in_flight != 1 else ''} in flight right after it, "
                "then no progress"
                if recovery.in_flight
                else "no progress after it"
            )
            problems.append(
                f"{what}: never recovered ({flight}"
                + (f"; workers restarted at {clock(recovery.restart.t)}" if recovery.restart else "")
                + f"{cut})"
            )
        elif spec.max_recovery_s is not None and public.recovery_s > spec.max_recovery_s:
            problems.append(f"{what}: recovered in {public.recovery_s:.1f} s > max {spec.max_recovery_s:g} s")
        else:
            lost = "steps lost unknown" if public.steps_lost is None else f"{public.steps_lost} steps lost"
            facts.append(
                f"{what}: recovered in {public.recovery_s:.1f} s at world {public.world_after}, {lost}"
                + _throughput_words(public)
            )
    late = [f for f in run.faults if f.t_invoke >= run.t_training_ended]
    facts += [f"{f.describe()}: after training ended, not checked" for f in late]
    return CheckResult(
        "recovery",
        not problems,
        tuple(problems + facts),
        RecoveryMetrics(recoveries=tuple(r.public() for r in found)),
    )


def _throughput_words(recovery: FaultRecovery) -> str:
    if recovery.throughput_before is None and recovery.throughput_after is None:
        return ""

    def rate(value: float | None) -> str:
        return "?" if value is None else f"{value:.2f}"

    if recovery.degraded:
        during = f"{rate(recovery.throughput_before)} -> {rate(recovery.throughput_during)} (during)"
        # A fault never healed (etcd killed, a clock left skewed) has no "after".
        after = "" if recovery.throughput_after is None else f" -> {rate(recovery.throughput_after)}"
        return f"; {during}{after} steps/s"
    return f"; {rate(recovery.throughput_before)} -> {rate(recovery.throughput_after)} steps/s"


def check_fails_cleanly(run: RunModel, spec: RunSpec) -> CheckResult:
    """For a run meant to fail: it did not complete, and every agent exited non-zero
    (or was killed) within fail_fast_s of the fault, none left hanging."""
    reasons = []
    finished = run.finished(spec.target_steps)
    if finished is not None:
        step = finished.final_step if isinstance(finished, TrainerRecord) else None
        reasons.append(f"the job completed (step {step} at {clock(finished.t)}) but was expected to fail")
    removed = run.removed_on_purpose()
    ended: dict[str, AgentEnd] = {}  # node -> the fault its exit followed (op) and how long after
    trained_on = []
    for node in run.agent_nodes:
        last = run.lifecycle(node)
        if last is None or last.action != "die":
            steps = run.trained_on(node)
            if steps is None:
                reasons.append(f"{node} still running at the run end: the job hung instead of failing")
            else:
                trained_on.append(node)
                first, final = steps
                reasons.append(
                    f"{node} still running at the run end, training on (step {first.step} to {final.step} after the "
                    f"last fault, the last at {clock(final.t)}): the job survived the fault instead of ending"
                )
            continue
        if last.exit_code == 0 and node not in removed:
            reasons.append(f"{node}'s agent exited 0 at {clock(last.t)}, as if the job had succeeded")
        cause = _last_fault_before(run, last.t)
        # An exit while the fault was still being injected (its ok not yet written) counts as immediate.
        delay = max(0.0, last.t - cause.t_ok) if cause else last.t - run.t_begin
        ended[node] = AgentEnd(
            after_op=cause.op if cause else None,
            delay_s=round(delay, 3),
            since_invoke_s=round(last.t - cause.t_invoke, 3) if cause else None,
        )
        if delay > spec.fail_fast_s:
            after = f"after {cause.describe()}" if cause else "after the run started"
            reasons.append(f"{node} exited {delay:.1f} s {after} > fail_fast {spec.fail_fast_s:g} s")
    return CheckResult(
        "fails_cleanly",
        not reasons,
        tuple(reasons[:MAX_EXAMPLES]),
        FailsCleanlyMetrics(
            exits={n: _exit_summary(run.lifecycle(n)) for n in run.agent_nodes},
            ended=ended,
            trained_on=tuple(trained_on) or None,
        ),
    )


def check_stalled(run: RunModel, spec: RunSpec) -> CheckResult:
    """For a run meant to hang (a collective blocked with the 30-minute default process-group timeout):
    after the last fault no progress for at least hang_s up to the run's end, the job not completed,
    every agent still running and no new worker group started."""
    if not run.beats and not spec.instrumented:
        return CheckResult(
            "stalled",
            False,
            (
                "cannot tell a hang from a quiet job: training cannot be seen (instrumentation off, no "
                "progress lines); drop --no-instrument or pass --progress-regex",
            ),
            StalledMetrics(stalled_s=None),
            measured=False,
        )
    if not run.faults:
        reason = "no fault took effect: nothing was there to hang on"
        return CheckResult("stalled", False, (reason,), StalledMetrics(stalled_s=None))
    reasons = []
    fault = run.faults[-1]
    finished = run.finished(spec.target_steps)
    if finished is not None:
        reasons.append(f"the job completed at {clock(finished.t)} but was expected to hang")
    last_beat = max(run.beat_times, default=run.t_begin)
    quiet_from = max(last_beat, fault.t_invoke)
    stalled = run.t_end - quiet_from
    if stalled < spec.hang_s:
        reasons.append(
            f"only {stalled:.1f} s without progress before the run ended (from {clock(quiet_from)}), "
            f"fewer than the {spec.hang_s:g} s that make a hang"
        )
    for node in run.agent_nodes:
        last = run.lifecycle(node)
        if last is not None and last.action == "die" and last.t > fault.t_invoke:
            reasons.append(f"{node}'s agent exited at {clock(last.t)}: the job ended instead of hanging")
    restarted = [t for t in run.cohort_times if t > fault.t_invoke]
    if restarted:
        reasons.append(f"a new worker group started at {clock(restarted[0])}: the job regrouped instead of hanging")
    facts = (
        ()
        if reasons
        else (
            f"no progress for {stalled:.0f} s after {fault.describe()}, every agent still running, no restart: "
            "the workers wait in a collective until the process group's timeout",
        )
    )
    return CheckResult(
        "stalled",
        not reasons,
        tuple(reasons[:MAX_EXAMPLES]) + facts,
        StalledMetrics(stalled_s=round(stalled, 3), after_op=fault.op),
    )


def _last_fault_before(run: RunModel, t: float) -> FaultEvent | None:
    before = [f for f in run.faults if f.t_invoke <= t]
    return before[-1] if before else None


# ---------------------------------------------------------------- a job that cannot finish (while it runs)

# torch 2.13's process-group timeout by default (torch.distributed.constants.default_pg_timeout): init_process_group's
# waits in the store and every collective's, for gloo (NCCL's own default is 10 minutes).
DEFAULT_PG_TIMEOUT_S = 1800
# torch's rendezvous join timeout by default (dynamic_rendezvous: join_timeout), unless --rdzv-conf sets one.
DEFAULT_JOIN_TIMEOUT_S = 600


@dataclasses.dataclass(frozen=True)
class Stuck:
    """A job that cannot finish: an agent gave up (its node exited non-zero), and the rest have made no progress
    since, past the hang window, with no fault in force: torch's own timeouts would end it, much later."""

    gave_up: tuple[tuple[str, float, int | None], ...]  # (node, when its container exited, exit code)
    quiet_since: float
    quiet_s: float
    waiting: tuple[str, ...]  # per survivor: what it waits for, and how long torch would let it

    def words(self) -> list[str]:
        """The lines `up` prints before its verdict."""
        gave = ", ".join(
            f"{node}'s agent gave up at {clock(t)} (its node exited {'?' if code is None else code})"
            for node, t, code in self.gave_up
        )
        return [
            f"the job cannot finish: {gave}, and the rest made no progress for {self.quiet_s:.0f} s since "
            f"{clock(self.quiet_since)}, with no fault in force",
            *self.waiting,
        ]


def cannot_finish(run: RunModel, now: float, hang_s: float = RunSpec.hang_s) -> Stuck | None:
    """Whether a running job can no longer finish, at time `now` (the caller's clock; nothing here reads one): an
    agent gave up (its node's container exited non-zero, not taken out by a fault) while other nodes still run;
    since then (and since the last training, regroup or fault) no progress for longer than hang_s; and no fault in
    force now. None otherwise: the job is running, regrouping, or has ended (every node exited)."""
    removed = run.removed_on_purpose()
    gave_up, survivors = [], []
    for node in run.agent_nodes:
        last = run.lifecycle(node)
        if last is not None and last.action == "die":
            if last.exit_code != 0 and node not in removed:
                gave_up.append((node, last.t, last.exit_code))
        elif last is not None:
            survivors.append(node)
    finished = {r.node for r in run.agent_events("group_finished")}
    if not gave_up or not survivors or all(node in finished for node in survivors):
        return None  # every node still up has its workers done: it waits out torch's exit barrier, the job ended
    regrouped = [
        r.t for r in run.agent if r.node in survivors and r.event in ("group_started", "rdzv_joined", "rdzv_complete")
    ]
    faults = [f.t_ok for f in run.faults] + [h.t_ok for h in run.heals]
    quiet_since = max([min(t for _, t, _ in gave_up), *run.beat_times[-1:], *regrouped, *faults])
    if now - quiet_since <= hang_s:
        return None
    if any(fault.kind.reversible and run.healed_at(fault) is None for fault in run.faults):
        return None  # a pause, partition or link fault still holds: the silence may be its doing
    return Stuck(tuple(gave_up), quiet_since, now - quiet_since, tuple(_waits_for(run, node) for node in survivors))


def _waits_for(run: RunModel, node: str) -> str:
    """What a surviving node waits for, in words, and how long torch would let it."""
    started = run.agent_events("group_started", node=node)
    joining = run.agent_events("rdzv_joining", "rdzv_joined", node=node)
    if not started or (joining and joining[-1].t > started[-1].t):
        join = run.spec_fields.pairs["rdzv_conf"].get("join_timeout")
        limit = f"--rdzv-conf join_timeout={join} s" if join is not None else f"{DEFAULT_JOIN_TIMEOUT_S // 60} min"
        return (
            f"{node}'s agent waits in the rendezvous for nodes that are gone; torch's join timeout would let it "
            f"wait {limit}"
        )
    since = started[-1].t
    # A worker stamps its own records, Docker the agent's lines when it reads them: the group's workers can
    # be stamped before its group_started line, never before the agent began that round's rendezvous.
    begun = max((r.t for r in joining if r.event == "rdzv_joining" and r.t <= since), default=since)
    workers = [r for r in run.records if isinstance(r, WorkerRecord) and r.node == node and r.t >= begun]
    pg = f"torch's default process-group timeout would let it wait {DEFAULT_PG_TIMEOUT_S // 60} min"
    if not any(r.event == "start" for r in workers):
        return f"{node}'s worker group started at {clock(since)}; no worker of it said more"
    if any(r.event == "pg_ready" for r in workers) or any(b.node == node and b.t >= begun for b in run.beats):
        return f"{node}'s worker waits in a collective for a peer that is gone; {pg} (unless the script gave one)"
    return f"{node}'s worker waits in init_process_group for a peer that is gone; {pg} (unless the script gave one)"


# ---------------------------------------------------------------- all together

CHECKERS: dict[str, Callable[[RunModel, RunSpec], CheckResult]] = {
    "trained": check_trained,
    "completed": check_completed,
    "restart_budget": check_restart_budget,
    "world_size": check_world_size,
    "ranks": check_ranks,
    "progress": check_progress,
    "loss_continuity": check_loss_continuity,
    "checkpoint_integrity": check_checkpoint_integrity,
    "stale_checkpoint": check_stale_checkpoint,
    "single_group": check_single_group,
    "hang": check_hang,
    "recovery": check_recovery,
    "fails_cleanly": check_fails_cleanly,
    "stalled": check_stalled,
}
CHECKS_FOR = {
    "recovers": (
        "trained",
        "completed",
        "restart_budget",
        "world_size",
        "ranks",
        "progress",
        "loss_continuity",
        "checkpoint_integrity",
        "stale_checkpoint",
        "single_group",
        "hang",
        "recovery",
    ),
    # A failing run stops where it stops: progress, loss and recovery say nothing about it.
    "fails": ("trained", "fails_cleanly", "restart_budget", "world_size", "ranks"),
    # A hanging run is stopped by the harness after hang_s of silence: only how it stands then is judged.
    "hangs": ("trained", "stalled", "restart_budget", "world_size", "ranks"),
}


def check_all(
    run: RunModel, spec: RunSpec, only: Sequence[str] | None = None, *, judge_training: bool = True
) -> Verdict:
    """Run the checkers that apply to the spec's expected outcome (or just those in `only`;
    restart_budget always runs, since the verdict reports restarts per node from it, and so does trained:
    no run passes without training). `judge_training` False: a run still going, which may not have trained yet."""
    names = CHECKS_FOR[spec.expected] if only is None else tuple(dict.fromkeys(["trained", *only, "restart_budget"]))
    if not judge_training:
        names = tuple(name for name in names if name != "trained")
    results = tuple(CHECKERS[name](run, spec) for name in names)
    by_name = {r.name: r for r in results}
    recovery = by_name.get("recovery")
    recoveries = recovery.metrics.recoveries if recovery is not None else ()
    trained = by_name.get("trained")
    undetermined = trained is not None and not trained.measured and all(r.valid for r in results if r is not trained)
    return Verdict(
        undetermined=undetermined,
        valid=all(r.valid for r in results),
        expected=spec.expected,
        results=results,
        recoveries=recoveries,
        restarts_per_node=dict(by_name["restart_budget"].metrics.per_node),
        rounds=_rounds(run),
    )


def _rounds(run: RunModel) -> int:
    """Distinct rendezvous rounds the agents joined; cohorts when no agent said."""
    rounds = {r.round for r in run.agent if r.event == "rdzv_joined" and r.round is not None}
    return len(rounds) if rounds else len(run.cohorts)


# ---------------------------------------------------------------- small helpers


def _rank_order(rank) -> tuple[int, object]:
    """Ranks in numeric order; anything not a number after them."""
    return (0, rank) if isinstance(rank, int) else (1, str(rank))


def _not_finished_reason(run: RunModel, spec: RunSpec) -> str:
    goal = f"step {spec.target_steps}" if spec.target_steps is not None else "its end"
    if run.step_source == "trainer":
        last = run.progress[-1]
        return (
            f"the job never reached {goal}: highest step {run.highest_step}, "
            f"last progress at {clock(last.t)}, no trainer summary"
        )
    ended = "no agent reported its worker group finished"
    if not run.beats:
        return f"the job never reached {goal}: {ended}, and no training was seen"
    step = f", highest step {run.highest_step}" if run.steps_known and run.progress else ""
    return f"the job never reached {goal}: {ended}; last training seen at {clock(run.beats[-1].t)}{step}"


def _exit_text(die: DockerRecord) -> str:
    code = die.exit_code
    return "with an unknown exit code" if code is None else str(code)


def _exit_summary(record: DockerRecord | None) -> str:
    if record is None or record.action != "die":
        return "running"
    return f"exited {_exit_text(record)}"


def _span(losses: dict) -> str:
    steps = sorted(losses)
    return str(steps[0]) if len(steps) == 1 else f"{steps[0]}..{steps[-1]}"


def _steps(steps: list[int]) -> str:
    return f"step {steps[0]}" if len(steps) == 1 else "steps " + ", ".join(map(str, steps))


def _ranks(ranks: list) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(str(r) for r in ranks)
