"""The catalog's tours (every fault kind in one job, one after another): test_catalog.py's runs,
in a module of their own so that they run beside the rest under pytest-xdist."""

from __future__ import annotations

import pytest

from tests.integration.test_catalog import cases, check_scenario

pytestmark = pytest.mark.docker


@pytest.mark.parametrize("scenario, backend", cases(tours=True))
def test_tour(sim_scenario, docker, images, scenario, backend):
    check_scenario(sim_scenario, scenario, backend)
