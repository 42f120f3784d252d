"""`sim forecast --check`: the forecast at the vet's own scale against a real soak of the same job.

The soak: the vet's job (its first run's spec), steady; first its re-measure, `remeasure` faults of the kind (each
once the job is steady, as the vet strikes), whose median recovery, slow start, step time and save cost replace the
vet's in the forecast judged (the vet measured once, under another load of a shared host: a restart's CPU-bound
phases follow that load); then one fault of the kind `every_s` seconds on average after the job recovered from the
one before (seeded gaps between half and one and a half times that, so the faults land anywhere in the checkpoint
cycle), on a random node (seeded), until the gaps fill `duration_s`. Its goodput between the soak's first fault and
its last (sim.vet.forecast's soak_measure: never the re-measure's) is set beside the model's for that rate
(soak_prediction), from the re-measured inputs (judged) and from the vet's own (printed beside, with its error).
`remeasure` 0: no re-measure, the vet's inputs judged.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from pathlib import Path

from sim.core.errors import UsageError
from sim.core.history import FILE_NAME, History
from sim.core.spec import ClusterSpec
from sim.scenarios.runner import ScenarioRunner
from sim.scenarios.scenario import Expectation, Scenario, Step, Trigger
from sim.verdict.checkers import CHECKS_FOR
from sim.verdict.recovery import THROUGHPUT_WINDOW_S
from sim.verdict.runfolder import ENDING_CHECKS
from sim.verdict.runmodel import RunModel
from sim.vet.forecast import (
    KindCost,
    Measurements,
    Remeasured,
    Shares,
    SoakMeasure,
    remeasure,
    soak_measure,
    soak_prediction,
)
from sim.vet.gauntlet import STEP_BUDGET_S, VET_PROFILE

TOLERANCE = 0.10  # the model must come within 10 % of the measured goodput
START_ALLOWANCE_S = 900.0  # a shared engine: the soak's cluster may wait this long for others' builds and starts
REMEASURE = 3  # the re-measure's faults before the soak (--remeasure): a median of three outvotes one slow restart


@dataclasses.dataclass(frozen=True)
class CheckResult:
    kind: str
    every_s: float
    seed: int
    measured: SoakMeasure
    predicted: Shares  # the forecast judged: from the re-measured inputs, or the vet's where none were
    run_dir: str
    given_soak: Shares | None = None  # the model given the soak's own recoveries: its error apart from its inputs'
    vet_cost: KindCost | None = None  # what the vet measured of the kind (its phases beside the soak's)
    remeasured: Remeasured | None = None  # the inputs re-measured just before the soak (None: the vet's judged)
    vet_predicted: Shares | None = None  # the forecast from the vet's own inputs, beside the judged one
    remeasure_asked: int = 0  # the re-measure's faults asked for (0: the vet's inputs judged, --remeasure 0)
    vet_step_s: float | None = None  # the vet's step time (beside the re-measured one)

    @property
    def error(self) -> float:
        """The judged prediction's error relative to the measured goodput."""
        return (self.predicted.goodput - self.measured.goodput) / self.measured.goodput

    @property
    def within(self) -> bool:
        return abs(self.error) <= TOLERANCE

    @property
    def inputs(self) -> str:
        """Which inputs the judged forecast is from: "remeasured" (on the soak's cluster) or "vet"."""
        return "vet" if self.remeasured is None else "remeasured"

    @property
    def vet_error(self) -> float:
        """The error of the forecast from the vet's own inputs (judged or not)."""
        vet = self.vet_predicted or self.predicted
        return (vet.goodput - self.measured.goodput) / self.measured.goodput

    def as_dict(self) -> dict:
        vet = self.vet_predicted or self.predicted
        return {
            "kind": self.kind,
            "every_s": self.every_s,
            "seed": self.seed,
            "measured": {**dataclasses.asdict(self.measured), "goodput": self.measured.goodput},
            "inputs": self.inputs,
            "predicted": dataclasses.asdict(self.predicted),
            "error": self.error,
            "remeasured": None if self.remeasured is None else self.remeasured.as_dict(),
            "vet_predicted": dataclasses.asdict(vet),
            "vet_error": self.vet_error,
            "vet_within": abs(self.vet_error) <= TOLERANCE,
            "given_soak_recoveries": None if self.given_soak is None else dataclasses.asdict(self.given_soak),
            "vet_cost": None if self.vet_cost is None else dataclasses.asdict(self.vet_cost),
            "within": self.within,
            "tolerance": TOLERANCE,
            "run_dir": self.run_dir,
        }

    def line(self) -> str:
        m, p = self.measured, self.predicted
        return (
            self._inputs()
            + f"check: {m.faults} {self.kind} faults in {m.window_s:.0f} s (one every {m.window_s / m.faults:.0f} s): "
            f"goodput measured {100 * m.goodput:.1f} % ({m.steps} steps at {m.step_s:.3f} s), forecast "
            f"{100 * p.goodput:.1f} % (restarts {100 * p.restarts:.1f} %, re-done {100 * p.redone:.1f} %, "
            f"checkpoint {100 * p.checkpoint:.1f} %): {100 * self.error:+.1f} %, "
            + ("within" if self.within else "NOT within")
            + f" {100 * TOLERANCE:.0f} %"
            + self._vets()
            + self._given_soak()
        )

    def _inputs(self) -> str:
        """Which inputs the judged forecast is from, said first, the vet's beside them."""
        vet = self.vet_cost
        vets = "" if vet is None else f"{vet.recovery_s:.1f} s + {vet.slow_s:.1f} s slow start"
        step = "" if self.vet_step_s is None else f", step {self.vet_step_s:.3f} s"
        r = self.remeasured
        if r is None:
            if not self.remeasure_asked:
                return f"check: inputs: the vet's ({self.kind} {vets}{step}; --remeasure 0)\n"
            return (
                f"check: inputs: the vet's ({self.kind} {vets}{step}): of the {self.remeasure_asked} faults struck "
                "to re-measure them before the soak, none reached a first step\n"
            )
        c = r.cost
        samples = ", ".join(f"{s:.1f}" for s in r.samples)
        also = "".join(
            f", {name} {value:.3f} s" for name, value in (("step", r.step_s), ("save", r.save_s)) if value is not None
        )
        return (
            f"check: inputs re-measured on the soak's cluster just before it: {self.kind} {c.recovery_s:.1f} s + "
            f"{c.slow_s:.1f} s slow start (median of {len(r.samples)} of {r.faults}: {samples} s){also}; "
            f"the vet's: {vets}{step}\n"
        )

    def _vets(self) -> str:
        """The forecast from the vet's own inputs and its error, beside the judged one (nothing hidden)."""
        if self.vet_predicted is None:
            return ""
        within = "within" if abs(self.vet_error) <= TOLERANCE else "not within"
        return (
            f"\n  from the vet's own inputs the forecast is {100 * self.vet_predicted.goodput:.1f} % "
            f"({100 * self.vet_error:+.1f} %, {within} {100 * TOLERANCE:.0f} %; not judged: measured once, under "
            "another load of this host; --remeasure 0 judges it)"
        )

    def _given_soak(self) -> str:
        """The model's error apart from its inputs': its goodput given the soak's own recoveries."""
        m, g = self.measured, self.given_soak
        if g is None or m.recovery_s is None:
            return ""
        apart = (g.goodput - m.goodput) / m.goodput
        inputs = self.vet_cost if self.remeasured is None else self.remeasured.cost
        whose = "the vet's" if self.remeasured is None else "the re-measure's median"
        by_phase = ", ".join(
            f"{p.removesuffix('_s')} {inputs.phases[p]:.1f} -> {v:.1f}"
            for p, v in m.phases.items()
            if inputs is not None and inputs.phases.get(p) is not None
        )
        return (
            f"\n  the soak's own recoveries averaged {m.recovery_s:.1f} s "
            f"(the slowest {m.slowest_s or 0:.1f} s) + {m.slow_s or 0:.1f} s slow start: given those, the model says "
            f"{100 * g.goodput:.1f} % ({100 * apart:+.1f} %)"
            + (f"\n  phases in s, {whose} -> the soak's mean: {by_phase}" if by_phase else "")
        )


def vet_job(vet: dict, vet_dir: Path) -> ClusterSpec:
    """The job the vet ran: its first shared run's spec (spec.json in the run's folder)."""
    solo = {f.get("run_dir") for f in vet.get("faults", ()) if f.get("solo")}
    for run_dir in vet.get("run_dirs", ()):
        path = Path(run_dir) if Path(run_dir).is_absolute() else vet_dir / run_dir
        if run_dir not in solo and (path / "spec.json").is_file():
            return ClusterSpec.from_json((path / "spec.json").read_text(encoding="utf-8"))
    raise UsageError(f"{vet_dir}: the vet's runs keep no spec.json; vet again on this machine, then --check")


def soak_scenario(
    world: int,
    kind: str,
    every_s: float,
    duration_s: float,
    seed: int,
    backend: str = "etcd-v2",
    remeasure: int = 0,
) -> Scenario:
    """Steady first; then the re-measure's `remeasure` faults, each once the job is steady again and its throughput
    window after (THROUGHPUT_WINDOW_S) has passed, so that its slow start is measured whole; then the soak: a fault
    `every_s` on average (seeded gaps: the same for a seed, re-measured or not) after the job has recovered from the
    one before, until the gaps fill `duration_s`. Each fault strikes a training job, as the model takes it (at scale
    a job fails every few hours and recovers in a minute): a fault timed from the one before could land inside its
    recovery, where its cost is not its own (seen: a 59 s "recovery" that held the next fault's)."""
    rng = random.Random(seed)
    gaps: list[float] = []
    while sum(gaps) < duration_s:
        gaps.append(round(rng.uniform(0.5, 1.5) * every_s, 1))
    lag = THROUGHPUT_WINDOW_S if remeasure else 0.0
    steps = [Step(kind, {"target": "random"}, Trigger("recovered", world, lag_s=lag)) for _ in range(remeasure)]
    steps += [Step(kind, {"target": "random"}, Trigger("recovered", world, lag_s=lag))]
    steps += [Step(kind, {"target": "random"}, Trigger("recovered", world, lag_s=gap)) for gap in gaps]
    checkers = tuple(c for c in CHECKS_FOR["recovers"] if c not in ENDING_CHECKS)
    again = f"{remeasure} to re-measure its cost, then " if remeasure else ""
    return Scenario(
        "forecast-soak",
        f"sim forecast --check: {again}{kind} every {every_s:g} s on average for {duration_s:g} s",
        backends=(backend,),
        profile=VET_PROFILE,
        seed=seed,
        steps=tuple(steps),
        expect=Expectation({backend: "recovers"}, checkers=checkers),
        # The run's bound counts from before the cluster's start, which may wait on other clusters' image builds;
        # each fault's recovery comes on top of the gaps.
        timeout_s=duration_s * 1.5 + STEP_BUDGET_S * (3 + len(steps)) + START_ALLOWANCE_S,
    )


def check_inputs(m: Measurements, kind: str, every_s: float, duration_s: float, remeasure: int = REMEASURE) -> None:
    """The soak's inputs, checked before anything starts (one line each)."""
    if every_s < 10:
        raise UsageError(f"--every {every_s:g}s: too often to recover in between; give 10s or more, e.g. 60s")
    if duration_s < 2 * every_s:
        raise UsageError(f"--soak {duration_s:g}s: shorter than two faults; give at least twice --every")
    if not 0 <= remeasure <= 10:
        raise UsageError(
            f"--remeasure {remeasure}: give the faults that re-measure the inputs before the soak, 0 to 10 "
            f"(default {REMEASURE}; 0 judges the vet's own inputs)"
        )
    if kind not in {k.kind for k in m.kinds}:
        measured = ", ".join(k.kind for k in m.kinds)
        raise UsageError(f"--check-kind {kind}: the vet did not measure it; use one it did: {measured}")
    if m.interval_steps is None:  # the model would take every restart to re-do the whole job: nothing to check
        raise UsageError(
            "--check: the vet saw no checkpoint save (its faults struck before the first); give the steps between "
            "the job's saves, --ckpt-every N, or vet it saving more often"
        )


def run_check(
    m: Measurements,
    spec: ClusterSpec,
    *,
    kind: str,
    every_s: float,
    duration_s: float,
    seed: int,
    name: str,
    remeasure: int = REMEASURE,
    docker=None,
    progress: Callable[[str], None] = print,
) -> CheckResult:
    check_inputs(m, kind, every_s, duration_s, remeasure)
    world = spec.nodes * spec.nproc_per_node
    scenario = soak_scenario(world, kind, every_s, duration_s, seed, spec.rdzv_backend, remeasure)
    faults = len(scenario.steps)
    spec = dataclasses.replace(spec, name=name, max_restarts=max(spec.max_restarts or 0, faults + 10))
    if remeasure:
        progress(f"[check] re-measure: {remeasure} {kind} faults, each once the job is steady, before the soak")
    progress(f"[check] soak: {faults - remeasure} {kind} faults, one every {every_s:g} s on average (seed {seed})")
    result = ScenarioRunner(
        scenario,
        spec.rdzv_backend,
        docker=docker,
        progress=progress,
        spec=spec,
        stop_after=Trigger("recovered", world),
        step_timeout_s=STEP_BUDGET_S,
    ).run()
    run = RunModel(History(result.run_dir / FILE_NAME).read().records)
    if result.unfired:
        raise UsageError(f"the soak did not run as planned: {result.unfired} (its history: {result.run_dir})")
    return judge(m, kind, every_s, seed, run, str(result.run_dir), remeasure)


def judge(
    m: Measurements, kind: str, every_s: float, seed: int, run: RunModel, run_dir: str, remeasure_faults: int = 0
) -> CheckResult:
    """The soak's goodput (its window: after the re-measure's first `remeasure_faults` faults) beside the model's,
    from the inputs re-measured by those faults (judged; the vet's where there were none) and from the vet's own,
    and the model given the soak's own recoveries."""
    measured = soak_measure(run, skip=remeasure_faults)
    again = remeasure(m, run, kind, remeasure_faults)
    judged = m if again is None else again.applied(m)
    predicted = soak_prediction(judged, kind, measured.faults, measured.window_s)
    vet_predicted = None if again is None else soak_prediction(m, kind, measured.faults, measured.window_s)
    given = None
    if measured.recovery_s is not None:
        own = dataclasses.replace(judged.cost(kind)[0], recovery_s=measured.recovery_s, slow_s=measured.slow_s or 0.0)
        given = soak_prediction(judged, kind, measured.faults, measured.window_s, own)
    return CheckResult(
        kind,
        every_s,
        seed,
        measured,
        predicted,
        run_dir,
        given,
        m.cost(kind)[0],
        again,
        vet_predicted,
        remeasure_faults,
        m.step_s,
    )
