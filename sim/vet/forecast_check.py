"""`sim forecast --check`: the forecast at the vet's own scale against a real soak of the same job.

The soak: the vet's job (its first run's spec), steady, then one fault of a kind the vet measured `every_s`
seconds on average after the job recovered from the one before (seeded gaps between half and one and a half times
that, so the faults land anywhere in the checkpoint cycle), on a random node (seeded), until the gaps fill
`duration_s`. Its goodput (sim.vet.forecast's
soak_measure) is set beside the model's for that rate (soak_prediction).
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
from sim.verdict.runfolder import ENDING_CHECKS
from sim.verdict.runmodel import RunModel
from sim.vet.forecast import KindCost, Measurements, Shares, SoakMeasure, soak_measure, soak_prediction
from sim.vet.gauntlet import STEP_BUDGET_S, VET_PROFILE

TOLERANCE = 0.10  # the model must come within 10 % of the measured goodput
START_ALLOWANCE_S = 900.0  # a shared engine: the soak's cluster may wait this long for others' builds and starts


@dataclasses.dataclass(frozen=True)
class CheckResult:
    kind: str
    every_s: float
    seed: int
    measured: SoakMeasure
    predicted: Shares
    run_dir: str
    given_soak: Shares | None = None  # the model given the soak's own recoveries: its error apart from its inputs'
    vet_cost: KindCost | None = None  # what the vet measured of the kind (its phases beside the soak's)

    @property
    def error(self) -> float:
        """The prediction's error relative to the measured goodput."""
        return (self.predicted.goodput - self.measured.goodput) / self.measured.goodput

    @property
    def within(self) -> bool:
        return abs(self.error) <= TOLERANCE

    def as_dict(self) -> dict:
        return {
            "kind": self.kind,
            "every_s": self.every_s,
            "seed": self.seed,
            "measured": {**dataclasses.asdict(self.measured), "goodput": self.measured.goodput},
            "predicted": dataclasses.asdict(self.predicted),
            "error": self.error,
            "given_soak_recoveries": None if self.given_soak is None else dataclasses.asdict(self.given_soak),
            "vet_cost": None if self.vet_cost is None else dataclasses.asdict(self.vet_cost),
            "within": self.within,
            "tolerance": TOLERANCE,
            "run_dir": self.run_dir,
        }

    def line(self) -> str:
        m, p = self.measured, self.predicted
        return (
            f"check: {m.faults} {self.kind} faults in {m.window_s:.0f} s (one every {m.window_s / m.faults:.0f} s): "
            f"goodput measured {100 * m.goodput:.1f} % ({m.steps} steps at {m.step_s:.3f} s), forecast "
            f"{100 * p.goodput:.1f} % (restarts {100 * p.restarts:.1f} %, re-done {100 * p.redone:.1f} %, "
            f"checkpoint {100 * p.checkpoint:.1f} %): {100 * self.error:+.1f} %, "
            + ("within" if self.within else "NOT within")
            + f" {100 * TOLERANCE:.0f} %"
            + self._given_soak()
        )

    def _given_soak(self) -> str:
        """The model's error apart from its inputs': its goodput given the soak's own recoveries."""
        m, g = self.measured, self.given_soak
        if g is None or m.recovery_s is None:
            return ""
        apart = (g.goodput - m.goodput) / m.goodput
        vet = self.vet_cost
        by_phase = ", ".join(
            f"{p.removesuffix('_s')} {vet.phases[p]:.1f} -> {v:.1f}"
            for p, v in m.phases.items()
            if vet is not None and vet.phases.get(p) is not None
        )
        return (
            f"\n  the vet measured this kind's recovery once; the soak's own recoveries averaged {m.recovery_s:.1f} s "
            f"(the slowest {m.slowest_s or 0:.1f} s) + {m.slow_s or 0:.1f} s slow start: given those, the model says "
            f"{100 * g.goodput:.1f} % ({100 * apart:+.1f} %)"
            + (f"\n  phases in s, the vet's -> the soak's mean: {by_phase}" if by_phase else "")
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
    world: int, kind: str, every_s: float, duration_s: float, seed: int, backend: str = "etcd-v2"
) -> Scenario:
    """Steady first, then a fault `every_s` on average (seeded gaps) after the job has recovered from the one
    before, until the gaps fill `duration_s`. Each fault strikes a training job, as the model takes it (at scale a
    job fails every few hours and recovers in a minute): a fault timed from the one before could land inside its
    recovery, where its cost is not its own (seen: a 59 s "recovery" that held the next fault's)."""
    rng = random.Random(seed)
    gaps: list[float] = []
    while sum(gaps) < duration_s:
        gaps.append(round(rng.uniform(0.5, 1.5) * every_s, 1))
    steps = [Step(kind, {"target": "random"}, Trigger("recovered", world))]
    steps += [Step(kind, {"target": "random"}, Trigger("recovered", world, lag_s=gap)) for gap in gaps]
    checkers = tuple(c for c in CHECKS_FOR["recovers"] if c not in ENDING_CHECKS)
    return Scenario(
        "forecast-soak",
        f"sim forecast --check: {kind} every {every_s:g} s on average for {duration_s:g} s",
        backends=(backend,),
        profile=VET_PROFILE,
        seed=seed,
        steps=tuple(steps),
        expect=Expectation({backend: "recovers"}, checkers=checkers),
        # The run's bound counts from before the cluster's start, which may wait on other clusters' image builds;
        # each fault's recovery comes on top of the gaps.
        timeout_s=duration_s * 1.5 + STEP_BUDGET_S * (3 + len(gaps)) + START_ALLOWANCE_S,
    )


def check_inputs(m: Measurements, kind: str, every_s: float, duration_s: float) -> None:
    """The soak's inputs, checked before anything starts (one line each)."""
    if every_s < 10:
        raise UsageError(f"--every {every_s:g}s: too often to recover in between; give 10s or more, e.g. 60s")
    if duration_s < 2 * every_s:
        raise UsageError(f"--soak {duration_s:g}s: shorter than two faults; give at least twice --every")
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
    docker=None,
    progress: Callable[[str], None] = print,
) -> CheckResult:
    check_inputs(m, kind, every_s, duration_s)
    world = spec.nodes * spec.nproc_per_node
    scenario = soak_scenario(world, kind, every_s, duration_s, seed, spec.rdzv_backend)
    faults = len(scenario.steps)
    spec = dataclasses.replace(spec, name=name, max_restarts=max(spec.max_restarts or 0, faults + 10))
    progress(f"[check] soak: {faults} {kind} faults, one every {every_s:g} s on average (seed {seed})")
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
    return judge(m, kind, every_s, seed, run, str(result.run_dir))


def judge(m: Measurements, kind: str, every_s: float, seed: int, run: RunModel, run_dir: str) -> CheckResult:
    """The soak's goodput beside the model's, from the vet's measurements and from the soak's own recoveries."""
    measured = soak_measure(run)
    predicted = soak_prediction(m, kind, measured.faults, measured.window_s)
    given = None
    if measured.recovery_s is not None:
        own = dataclasses.replace(m.cost(kind)[0], recovery_s=measured.recovery_s, slow_s=measured.slow_s or 0.0)
        given = soak_prediction(m, kind, measured.faults, measured.window_s, own)
    return CheckResult(kind, every_s, seed, measured, predicted, run_dir, given, m.cost(kind)[0])
