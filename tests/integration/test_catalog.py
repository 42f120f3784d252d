"""The fault-tolerance suite: every shipped scenario on every backend it names, with the fast
profile. `make test` runs the quick suite (sim.scenarios.shipped.QUICK_SUITE: every fault kind and
outcome on every backend); the rest are marked `full` and run in `make test-full`. A scenario
passes when its verdict matches its expectation (`recovers`, or `fails` the way torch is known
to: fast and cleanly). The tours, the longest runs, are in test_catalog_tours.py."""

from __future__ import annotations

import pytest

from sim.core.history import FILE_NAME, History
from sim.pytest_plugin import assert_verdict
from sim.scenarios.shipped import QUICK_SUITE, shipped_scenarios
from sim.verdict.checkers import RunSpec, check_recovery
from sim.verdict.runmodel import RunModel

pytestmark = pytest.mark.docker

# Every fault kind in one job, about 4 minutes each: a module of their own, so that make test's two
# pytest-xdist workers (--dist loadfile: a file's tests on one worker) run them beside the rest.
TOURS = ("tour", "tour-v3")


def cases(tours: bool) -> list:
    """The catalog's runs, the tours or the others; those outside the quick suite marked `full`."""
    return [
        pytest.param(
            s.name,
            backend,
            id=f"{s.name}[{backend}]",
            marks=() if (s.name, backend) in QUICK_SUITE else pytest.mark.full,
        )
        for s in shipped_scenarios()
        if (s.name in TOURS) == tours
        for backend in s.backends
    ]


def check_scenario(sim_scenario, scenario: str, backend: str) -> None:
    (result,) = sim_scenario(scenario, backend=backend)
    assert_verdict(result)
    if scenario in NEVER_RECOVERS:
        never_recovered(result.run_dir)


# Scenarios whose job hangs for good after its fault: judged as a job meant to recover, the same run never did.
NEVER_RECOVERS = ("hang-default-timeout",)


def never_recovered(run_dir) -> None:
    """A hang that never let go has no recovery figure, whatever its peers logged as the hold struck (issue 36:
    a step in flight just after the fault read as "recovered in 0.2 s")."""
    run = RunModel(History(run_dir / FILE_NAME).read().records)
    result = check_recovery(run, RunSpec.from_run(run, expected="recovers"))
    assert not result.valid, result.reasons
    assert [r.recovery_s for r in result.metrics.recoveries] == [None], result.metrics
    (reason,) = result.reasons
    assert "hang-collectives node1" in reason and "never recovered" in reason, reason
    assert "recovered in" not in reason, reason


@pytest.mark.parametrize("scenario, backend", cases(tours=False))
def test_scenario(sim_scenario, docker, images, scenario, backend):
    check_scenario(sim_scenario, scenario, backend)
