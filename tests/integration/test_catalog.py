"""The fault-tolerance suite: every shipped scenario on every backend it names, with the fast
profile. `make test` runs the quick suite (chaos.catalog.QUICK_SUITE: every fault kind and
outcome on every backend); the rest are marked `full` and run in `make test-full`. A scenario
passes when its verdict matches its expectation (`recovers`, or `fails` the way torch is known
to: fast and cleanly)."""

from __future__ import annotations

import pytest

from chaos.catalog import QUICK_SUITE, shipped_scenarios
from sim.pytest_plugin import assert_verdict

pytestmark = pytest.mark.docker

CASES = [
    pytest.param(
        s.name,
        backend,
        id=f"{s.name}[{backend}]",
        marks=() if (s.name, backend) in QUICK_SUITE else pytest.mark.full,
    )
    for s in shipped_scenarios()
    for backend in s.backends
]


@pytest.mark.parametrize("scenario, backend", CASES)
def test_scenario(sim_scenario, docker, images, scenario, backend):
    (result,) = sim_scenario(scenario, backend=backend)
    assert_verdict(result)
