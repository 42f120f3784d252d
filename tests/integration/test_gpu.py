"""A real GPU run: only where `sim doctor` finds a GPU runtime (none on the CI machine).
GPU passthrough itself is checked everywhere by the rendering unit tests."""

from __future__ import annotations

import pytest

from sim.cli.doctor import gpu_check
from sim.core.wait import wait_for
from sim.engines.cluster import Cluster, JobFinished
from tests.conftest import run_sim, unique_name


def test_nccl_training_on_gpus(docker, images):
    if not gpu_check(docker).ok:
        pytest.skip("no GPU runtime on this machine (sim doctor); GPU rendering is unit-tested")
    name = unique_name("t-gpu")
    result = run_sim(
        "up", "--name", name, "--detach", "--nodes", "1", "--gpus", "1", "--nproc-per-node", "1", "--", "--steps", "20"
    )
    try:
        assert result.returncode == 0, result.stderr
        cluster = Cluster(name, docker)
        wait_for(JobFinished(cluster), timeout=300)
        log = cluster.logs("node0")
        assert '"backend": "nccl"' in log and cluster.nodes()[0].exit_code == 0
    finally:
        run_sim("down", name)
