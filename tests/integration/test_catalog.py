"""The CI fault-tolerance suite: every shipped scenario on every backend it names,
with the fast profile. A scenario passes when its verdict matches its expectation
(`recovers`, or `fails` the way torch is known to: fast and cleanly)."""

from __future__ import annotations

import pytest

from chaos.catalog import shipped_scenarios
from sim.pytest_plugin import assert_verdict

pytestmark = pytest.mark.docker

CASES = [
    pytest.param(s.name, backend, id=f"{s.name}[{backend}]") for s in shipped_scenarios() for backend in s.backends
]


@pytest.mark.parametrize("scenario, backend", CASES)
def test_scenario(sim_scenario, docker, images, scenario, backend):
    (result,) = sim_scenario(scenario, backend=backend)
    assert_verdict(result)
