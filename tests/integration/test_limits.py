"""Each node's bounds on a real engine (issue 26, finding 7): the default memory limit and --pids reach the
containers, and an `up` that does not fit beside another running cluster is refused, naming it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sim.core.spec import HOST_RESERVE_MIB, ClusterSpec, machine_memory_mib
from tests.conftest import run_sim, unique_name

pytestmark = pytest.mark.docker


def test_nodes_get_their_bounds_and_a_cluster_that_does_not_fit_beside_them_is_refused(docker, images):
    first, second = unique_name("bounds"), unique_name("beside")
    try:
        result = run_sim(
            "up",
            "--name",
            first,
            "--detach",
            "--nodes",
            "1",
            "--nproc-per-node",
            "1",
            "--pids",
            "2048",
            "--rdzv-backend",
            "c10d",
        )
        assert result.returncode == 0, result.stderr[-3000:]
        spec = ClusterSpec.from_json((Path(os.environ["SIM_HOME"]) / "clusters" / first / "spec.json").read_text())
        assert spec.memory is None and spec.memory_limit is not None  # the default, as spec.json records it
        host = docker.api.inspect_container(f"{first}-node0")["HostConfig"]
        assert (host["Memory"], host["MemorySwap"], host["PidsLimit"]) == (spec.memory_limit, spec.memory_limit, 2048)
        # Alone, one node of all the machine's room fits; beside the first cluster's node it does not.
        room = machine_memory_mib() - HOST_RESERVE_MIB
        refused = run_sim("up", "--name", second, "--detach", "--nodes", "1", "--memory", f"{room}m")
        assert refused.returncode == 2, refused.stderr[-3000:]
        lines = [line for line in refused.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and f"'{first}'" in lines[0] and "python -m sim down" in lines[0], refused.stderr
        assert not docker.ids("container", f"label=elastic-sim.cluster={second}")
    finally:
        run_sim("down", first)
        run_sim("down", second)
