"""Each node's bounds on a real engine (issue 26, finding 7): the default memory limit and --pids reach the
containers, and an `up` that does not fit beside another running cluster is refused, naming it."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
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


def test_two_ups_at_once_that_fit_only_one_at_a_time_admit_one(docker, images):
    """Each alone fits; together they do not. Started at the same moment, both pass the first room check
    (before either has a node): the check again under the host's room lock refuses the later one."""
    names = [unique_name("race-a"), unique_name("race-b")]
    node_mib = (machine_memory_mib() - HOST_RESERVE_MIB) * 6 // 10
    args = ("--detach", "--nodes", "1", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--memory", f"{node_mib}m")
    try:
        with ThreadPoolExecutor(2) as pool:
            results = list(pool.map(lambda name: run_sim("up", "--name", name, *args), names))
        codes = sorted(result.returncode for result in results)
        assert codes == [0, 2], [result.stderr[-2000:] for result in results]
        (admitted,) = (name for name, result in zip(names, results, strict=True) if result.returncode == 0)
        (refused,) = (result for result in results if result.returncode == 2)
        lines = [line for line in refused.stderr.splitlines() if line.strip() and not line.startswith("[")]
        assert len(lines) == 1 and f"'{admitted}'" in lines[0] and "do not fit" in lines[0], refused.stderr
        for name in names:
            made = docker.ids("container", f"label=elastic-sim.cluster={name}")
            assert bool(made) == (name == admitted), (name, made)
    finally:
        for name in names:
            run_sim("down", name)
