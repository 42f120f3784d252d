"""Run a chaos scenario: bring up (or reuse) a cluster, fire its steps when the
history says so, wait for the end, check the history, report, tear down.

A run passes exactly when its verdict matches the scenario's expectation:
`recovers` (every checker valid) or `fails` (it failed the way torch is known
to, fast and cleanly). Triggers read the history as it grows, never sleep for
a guessed time.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

from sim.core import labels
from sim.core.errors import SimError, UsageError
from sim.core.history import FILE_NAME, AgentRecord, FaultResult, History, HistoryTail, RunRecord
from sim.core.paths import ClusterName
from sim.core.spec import ClusterSpec, spec_from_options
from sim.engines.cluster import DEFAULT_START_TIMEOUT, Cluster, JobFinished
from sim.engines.docker import Docker
from sim.engines.engine import ClusterEngine, choose_engine
from sim.faults.catalog import FAULTS
from sim.faults.nemesis import Nemesis
from sim.scenarios.scenario import RECOVERED_STEPS, Scenario, Step, Trigger, scenario_spec_options
from sim.verdict import Verdict
from sim.verdict.checkers import RunSpec
from sim.verdict.runfolder import report_run
from sim.verdict.runmodel import trigger_step

Progress = Callable[[str], None]
POLL_S = 0.5
# A hang is watched this much past its bound, so the checker sees the whole bound of silence.
QUIET_MARGIN_S = 5.0


def default_cluster_name(scenario: str, backend: str, session: str | None = None) -> str:
    """`chaos-<scenario>-<backend>`, within the 40 characters a cluster name may have: runs of one
    scenario on two backends at once (two terminals, the test suite's two workers) never share a
    name, since the `up` of a name sweeps whatever carries it. Inside a labelled session (SIM_SESSION:
    a test suite) a short tag of it ends the name, so two suites on one engine never refuse each other."""
    session = os.environ.get(labels.SESSION_ENV) if session is None else session
    tail = f"{backend}-{hashlib.sha256(session.encode()).hexdigest()[:6]}" if session else backend
    return f"{f'chaos-{scenario}'[: 39 - len(tail)].rstrip('-')}-{tail}"


class StepNotFired(SimError):
    """A step's trigger was never reached (the job ended first, or the timeout came)."""


@dataclasses.dataclass(frozen=True)
class ScenarioResult:
    scenario: str
    backend: str
    expected: str
    verdict: Verdict
    summary: str
    run_dir: Path
    seed: int
    unfired: str | None = None  # why a step never fired, if one did not

    @property
    def passed(self) -> bool:
        return self.verdict.valid and self.unfired is None

    @property
    def timeline(self) -> Path:
        return self.run_dir / "report" / "timeline.png"


class HistoryState:
    """What the triggers need to know, folded from the history as it grows."""

    def __init__(self, path: Path):
        self.tail = HistoryTail(path)
        self.first_step_t: float | None = None
        self.max_step = 0
        self.world_size: int | None = None  # as of the newest progress line
        self.last_progress_t = 0.0
        self.max_round = -1
        self.joining: list[tuple[float, str | None]] = []  # (t, node) of each agent entering a rendezvous
        self.last_beat_t: float | None = None  # the newest training step seen, at any world size
        self.beats: list[tuple[float, int | None, int, object]] = []  # (t, world size, step, rank) of each step

    def update(self) -> None:
        for r in self.tail.poll():
            step = trigger_step(r)
            if step is not None:
                if self.first_step_t is None:
                    self.first_step_t = r.t
                self.max_step = max(self.max_step, step)
                self.last_beat_t = max(self.last_beat_t or r.t, r.t)
                self.beats.append((r.t, r.world_size, step, getattr(r, "rank", None)))
                if r.t >= self.last_progress_t and isinstance(r.world_size, int):
                    self.world_size, self.last_progress_t = r.world_size, r.t
            elif isinstance(r, AgentRecord) and r.event == "rdzv_joined":
                self.max_round = max(self.max_round, -1 if r.round is None else r.round)
            elif isinstance(r, AgentRecord) and r.event == "rdzv_joining":
                self.joining.append((r.t, r.node))

    def agents_joining(self, since: float) -> int:
        """How many agents entered a rendezvous (torch's "attempts to join the next round") since `since`."""
        return len({node for t, node in self.joining if t > since})

    def steady(self, world_size: int, since: float) -> bool:
        """Training is steady at `world_size` since `since`: every rank of it (where ranks are told) trained
        RECOVERED_STEPS steps in a row since its newest start. A rank's steps count from its last beat that
        went back (a restarted group resumes from an earlier step), and by their numbers, not their beats:
        the instrumentation's beats are samples (steps 21 and 26 are six steps trained)."""
        runs: dict[object, list[int]] = {}  # rank -> its steps since it last went back
        for _, _, step, rank in sorted((b for b in self.beats if b[0] > since and b[1] == world_size), key=_at):
            steps = runs.setdefault(rank, [])
            if steps and step < steps[-1]:
                steps.clear()
            steps.append(step)
        ranks = [rank for rank in runs if rank is not None]
        if not runs or (ranks and len(ranks) < world_size):
            return False
        return all(
            steps[-1] - steps[0] + 1 >= RECOVERED_STEPS for rank, steps in runs.items() if rank is not None or not ranks
        )


def _at(beat: tuple) -> float:
    return beat[0]


def trigger_words(trigger: Trigger) -> str:
    """What a trigger waits for, in the user's words."""
    kind, value = trigger.kind, trigger.value
    return {
        "step": f"the job reaching step {value}",
        "time": f"{value:g} s of training",
        "after": f"{value:g} s after the step before",
        "world_size": f"training at world size {value}",
        "round": f"rendezvous round {value}",
        "recovered": f"training steady at world size {value} ({RECOVERED_STEPS} steps in a row on every rank)",
    }[kind]


def step_words(step: Step | None) -> str:
    """A step as the user wrote it: its fault and target (and its line in the scenario file); None: the run's end."""
    if step is None:
        return "the end of the run"
    options = step.options.given()
    target = options.get("target") or (f"to {options['nodes']} nodes" if "nodes" in options else None)
    words = f"{step.fault} {target}" if target else step.fault
    return words + (f" (line {step.line})" if step.line else "")


def not_fired_words(step: Step | None, trigger: Trigger, state: HistoryState, now: float, why: str) -> str:
    """Why a step never fired, and what the job was doing: no runner terms."""
    if state.last_beat_t is None:
        doing = "the job never trained (no optimizer step, collective or step line was seen)"
    else:
        world = f" at world size {state.world_size}" if state.world_size is not None else ""
        doing = f"the job last trained {now - state.last_beat_t:.0f} s before{world}"
    if step is None:
        return (
            f"the job was not steady again after the last fault: waiting for {trigger_words(trigger)}, {why}; {doing}"
        )
    return f"{step_words(step)} never struck: waiting for {trigger_words(trigger)}, {why}; {doing}"


class ScenarioRunner:
    def __init__(
        self,
        scenario: Scenario,
        backend: str,
        *,
        docker: Docker | None = None,
        seed: int | None = None,
        keep: bool = False,
        keep_faults: bool = False,
        cluster_name: str | None = None,
        engine: str | None = None,
        progress: Progress = print,
        spec: ClusterSpec | None = None,
        stop_after: Trigger | None = None,
        step_timeout_s: float | None = None,
        cancel: threading.Event | None = None,
        fired: threading.Event | None = None,
    ):
        """`spec`: the cluster to make instead of the scenario's (`sim vet` builds it from `sim up`'s options).
        `stop_after`: once the last step fired, wait for this trigger and end the run there instead of
        waiting for the job to end (the vet's gauntlet need not see the job finish). `step_timeout_s`: the
        longest one trigger is waited for (a job that never recovers from one fault must not eat the rest)."""
        if backend not in scenario.backends:
            raise UsageError(f"backend '{backend}': scenario '{scenario.name}' runs on {', '.join(scenario.backends)}")
        self.scenario = scenario
        self.backend = backend
        self.docker = docker or Docker()
        self.seed = (
            seed
            if seed is not None
            else (scenario.seed if scenario.seed is not None else random.SystemRandom().randrange(2**31))
        )
        self.keep = keep
        self.keep_faults = keep_faults  # with --keep or --cluster: leave this run's faults in force
        self.cluster_name = cluster_name
        self.engine = engine  # compose or swarm; None: the scenario's (compose unless it says)
        self.progress = progress
        self.spec = spec
        self.stop_after = stop_after
        self.step_timeout_s = step_timeout_s
        self.cancel = cancel  # set from another thread: the run stops at its next poll (as Ctrl-C), cleaning up
        self.fired = fired  # set here once the first step has fired (the job was steady), or the run ended
        self._undo_timers: list[tuple[threading.Timer, _Once]] = []
        self._made: list[str] = []  # the ids of the faults this run put in force
        self._hold_end = 0.0  # when the newest held fault (a step's duration) is undone
        self._holds: dict[_Once, float] = {}  # each held fault's undo -> when it ends
        self._early_undos: list[tuple[_Once, int, float]] = []  # (undo, world size, since): Step.undo_once_recovered

    def run(self) -> ScenarioResult:
        scenario, expected = self.scenario, self.scenario.expect.outcome(self.backend)
        engine, cluster = self._cluster()
        # Counted once the cluster is up: its start (an image build, a wait on another cluster's build or
        # on the engine's room) has a limit of its own, and must not eat the scenario's.
        deadline = time.monotonic() + scenario.timeout_s
        run_dir = cluster.run_dir
        history = History(run_dir / FILE_NAME)
        history.append(
            RunRecord(
                t=time.time(),
                event="scenario",
                scenario=scenario.name,
                backend=self.backend,
                seed=self.seed,
                profile=scenario.profile,
                expected=expected,
                checkers=tuple(scenario.expect.checkers) if scenario.expect.checkers else None,
            )
        )
        nemesis = Nemesis(cluster, history=history, seed=self.seed)
        state = HistoryState(run_dir / FILE_NAME)
        unfired = None
        try:
            try:
                self._run_steps(nemesis, state, deadline)
            except StepNotFired as why:
                # The experiment did not happen as written: the run cannot pass.
                unfired = str(why)
                history.append(RunRecord(t=time.time(), event="step_not_fired", why=unfired))
                self.progress(f"[chaos] {unfired}")
            if self.stop_after is not None and unfired is None:
                try:
                    self._wait_trigger(nemesis, self.stop_after, None, state, time.time(), deadline)
                    self.progress("[chaos] steady after the last step: ending the run")
                except StepNotFired as why:
                    unfired = str(why)
                    history.append(RunRecord(t=time.time(), event="step_not_fired", why=unfired))
                    self.progress(f"[chaos] {unfired}")
            elif self.stop_after is not None:
                pass  # the job ended, or the timeout came, before the schedule was done
            elif expected == "hangs":
                self.progress(f"[chaos] waiting for {self._quiet_s:g} s without progress (a hang expected)")
                self._wait_quiet(cluster, state, deadline)
            else:
                self.progress(f"[chaos] waiting for the job to end ({expected} expected)")
                self._wait_end(cluster, deadline)
        finally:
            if self.fired is not None:
                self.fired.set()
            for timer, _ in self._undo_timers:
                timer.cancel()
            if not self.keep and self.cluster_name is None:
                engine.down(cluster, self.progress)
            elif not self.keep_faults:
                self._heal_own(nemesis)
        bounds = {
            k: v
            for k, v in dataclasses.asdict(scenario.expect).items()
            if k in ("max_recovery_s", "max_steps_lost", "hang_s", "fail_fast_s") and v is not None
        }
        verdict, summary = report_run(
            run_dir, expected=expected, title=f"{scenario.name} [{self.backend}]", profile=scenario.profile, **bounds
        )
        if unfired:
            summary += f"\nNOT VALID: {unfired}"
        return ScenarioResult(scenario.name, self.backend, expected, verdict, summary, run_dir, self.seed, unfired)

    def _heal_own(self, nemesis: Nemesis) -> None:
        """The cluster stays (--keep, --cluster): undo what this run did (also after Ctrl-C or SIGTERM).
        Pending undos first, as their timers would have; then any fault still in force that this run
        made or recorded the intent of (a call interrupted mid-act never returned its id), or, on a cluster of
        its own (--keep), any fault in force."""
        for _, undo in self._undo_timers:
            undo()
        try:
            active = nemesis.active()
            own = self.cluster_name is None
            mine = {*self._made, *nemesis.recorded}
            left = [f.id for f in active if own or f.id in mine]
            for fault_id in left:
                self.progress(f"[chaos] healing {fault_id} (the cluster stays; --keep-faults leaves faults)")
                nemesis.heal(fault_id)
        except SimError as error:
            self.progress(f"[chaos] healing failed: {error}; `sim heal --all --name {nemesis.cluster.name}`")

    def _cluster(self) -> tuple[ClusterEngine, Cluster]:
        if self.cluster_name:
            name = ClusterName(self.cluster_name, source="cluster")  # checked once, here
            engine = choose_engine(self.docker, name=name)
            cluster = engine.cluster(name)
            cluster.require_running()
            return engine, cluster
        if self.spec is not None:
            spec = self.spec
        else:
            options = scenario_spec_options(self.scenario, self.backend)
            options.setdefault("name", default_cluster_name(self.scenario.name, self.backend))
            if self.engine:
                options["engine"] = self.engine
            spec = spec_from_options(options, options.pop("script_args", None))
        self.progress(
            f"[chaos] {self.scenario.name} on {self.backend}: cluster {spec.name}, {spec.nodes} nodes, seed {self.seed}"
        )
        engine = choose_engine(self.docker, spec=spec)
        cluster = engine.up(spec, timeout=DEFAULT_START_TIMEOUT, progress=self.progress)
        if self.keep:
            cluster.release()  # kept for the user: this run ending is not a leak
        return engine, cluster

    # --- the schedule ------------------------------------------------------------------

    def _run_steps(self, nemesis: Nemesis, state: HistoryState, deadline: float) -> None:
        previous_done = time.time()
        for step in self.scenario.steps:
            for _ in range(max(step.repeat_times, 1)):
                self._wait_trigger(nemesis, step.trigger, step, state, previous_done, deadline)
                self.progress(f"[chaos] {step.fault} {getattr(step.options, 'target', '')}".rstrip())
                self._fire(nemesis, step)
                if self.fired is not None:
                    self.fired.set()
                previous_done = time.time()
                if step.repeat_times > 1:
                    step = dataclasses.replace(
                        step,
                        trigger=dataclasses.replace(step.trigger, kind="after", value=step.repeat_every_s, lag_s=0.0),
                    )

    def _wait_trigger(
        self,
        nemesis: Nemesis,
        trigger: Trigger,
        step: Step | None,
        state: HistoryState,
        previous_done: float,
        deadline: float,
    ) -> None:
        """Wait until `trigger` holds for `step` (None: the run's end, the job steady after the last step)."""
        self._wait_reached(nemesis, trigger, step, state, previous_done, deadline)
        if trigger.lag_s:  # `after` beside the trigger: that long after it was reached
            lagged = Trigger("after", trigger.lag_s)
            self._wait_reached(nemesis, lagged, step, state, time.time(), deadline)

    def _wait_reached(
        self,
        nemesis: Nemesis,
        trigger: Trigger,
        step: Step | None,
        state: HistoryState,
        previous_done: float,
        deadline: float,
    ) -> None:
        kind, value = trigger.kind, trigger.value
        waited_from = time.monotonic()
        if self.step_timeout_s is not None:
            deadline = min(deadline, time.monotonic() + self.step_timeout_s)
        next_liveness_check = time.monotonic()
        while True:
            if time.monotonic() >= next_liveness_check:  # first: a short `after` must not fire into an ended job
                next_liveness_check = time.monotonic() + 2.0
                if self._job_ended(nemesis.cluster):
                    state.update()
                    raise StepNotFired(
                        not_fired_words(step, trigger, state, time.time(), "the job ended (every node exited) first")
                    )
            self._check_cancel()
            state.update()
            self._end_holds_once_recovered(state)
            now = time.time()
            if kind == "step" and state.max_step >= value:
                return
            if kind == "time" and state.first_step_t is not None and now - state.first_step_t >= value:
                return
            if kind == "after" and now - previous_done >= value:
                return
            # Training at that size since the previous step acted (not a stale line from before).
            if kind == "world_size" and state.world_size == value and state.last_progress_t > previous_done:
                return
            if kind == "round" and state.max_round >= value:
                return
            # Inside a round, before it completes: the agents have entered it (and added themselves to it).
            if kind == "joining" and state.agents_joining(previous_done) >= value:
                return
            # A held fault (a lossy link, a straggler) acts until it is undone: steady counts from then.
            if kind == "recovered" and now > self._hold_end and state.steady(value, max(previous_done, self._hold_end)):
                return
            if time.monotonic() > deadline:
                waited = time.monotonic() - waited_from
                limit = "for one fault" if self.step_timeout_s else "for the whole scenario"
                why = f"it did not come in {waited:.0f} s, the time allowed {limit}"
                raise StepNotFired(not_fired_words(step, trigger, state, time.time(), why))
            time.sleep(POLL_S)

    def _fire(self, nemesis: Nemesis, step: Step) -> None:
        fault = FAULTS[step.fault]
        try:
            result = fault.invoke(nemesis, step.options)
        except SimError as error:
            # Recorded as `fail` in the history; the checkers judge what followed.
            self.progress(f"[chaos] {step.fault} failed: {error}")
            return
        made = FaultResult.parse(result).id
        if made:
            self._made.append(made)
        if step.duration_s and fault.undo is not None:
            undo = _Once(_quietly(lambda: fault.end_hold(nemesis, result)))
            timer = threading.Timer(step.duration_s, undo)
            timer.daemon = True
            timer.start()
            self._holds[undo] = time.time() + step.duration_s
            self._hold_end = max(self._holds.values())
            self._undo_timers.append((timer, undo))
            if step.undo_once_recovered is not None:
                self._early_undos.append((undo, step.undo_once_recovered, time.time()))

    def _end_holds_once_recovered(self, state: HistoryState) -> None:
        """Undo now a held fault whose job is steady again at the world size it waits for (its timer then
        finds it done); the steps after it count from this end."""
        for entry in list(self._early_undos):
            undo, world, since = entry
            if undo.done:
                self._early_undos.remove(entry)
            elif state.steady(world, since):
                self._early_undos.remove(entry)
                self.progress(f"[chaos] steady at world {world}: undoing the held fault before its time")
                undo()
                self._holds[undo] = time.time()
                self._hold_end = max(self._holds.values())

    def _check_cancel(self) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise KeyboardInterrupt  # the cleanup of an interrupted run: faults undone, the cluster down

    @staticmethod
    def _job_ended(cluster: Cluster) -> bool:
        check = JobFinished(cluster).check()
        return check.ready or check.failure is not None

    def _wait_end(self, cluster: Cluster, deadline: float) -> None:
        strategy = JobFinished(cluster)
        while True:
            self._check_cancel()
            check = strategy.check()
            if check.ready or check.failure:
                return
            if time.monotonic() > deadline:
                self.progress("[chaos] scenario timeout: the job did not end (the checkers will say hang)")
                return
            time.sleep(1.0)

    @property
    def _quiet_s(self) -> float:
        """How long without progress makes a hang: the scenario's hang_s, else the checkers' default."""
        return self.scenario.expect.hang_s or RunSpec.hang_s

    def _wait_quiet(self, cluster: Cluster, state: HistoryState, deadline: float) -> None:
        """For a run expected to hang: wait until no progress for the hang bound since the last
        fault fired (the checkers then judge the stall), or the job ends, or the timeout."""
        fired = time.time()
        while True:
            self._check_cancel()
            state.update()
            quiet_from = max(state.last_beat_t or fired, fired)
            if time.time() - quiet_from > self._quiet_s + QUIET_MARGIN_S:
                return
            if self._job_ended(cluster):
                return
            if time.monotonic() > deadline:
                self.progress("[chaos] scenario timeout: progress went on (the checkers will say so)")
                return
            time.sleep(1.0)


def run_scenario(scenario: Scenario, backend: str | None = None, **runner_options) -> list[ScenarioResult]:
    """Run `scenario` on `backend`, or on each backend it names; options as ScenarioRunner's."""
    backends = scenario.backends if backend is None else (backend,)
    return [ScenarioRunner(scenario, name, **runner_options).run() for name in backends]


class _Once:
    """A pending undo: run by its timer or at the end of the run, whichever comes first; never twice."""

    def __init__(self, fn: Callable[[], None]):
        self.fn, self.done, self.lock = fn, False, threading.Lock()

    def __call__(self) -> None:
        with self.lock:
            if self.done:
                return
            self.done = True
            self.fn()


def _quietly(fn: Callable[[], object]) -> Callable[[], None]:
    def run() -> None:
        try:
            fn()
        except SimError:
            pass  # the nemesis recorded the failure in the history

    return run
